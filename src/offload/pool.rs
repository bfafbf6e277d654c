//! [`BlockPool`]: a caching allocator of page-aligned host blocks, for memory a training step
//! frees and asks for again at the same sizes (activations, their gradients, tensors read
//! back), so that a block is faulted in once, not every step.

use super::allocator::{round_up, EXTENT_ALIGN};
use fastensor_core::{HostBuffer, Result};
use std::collections::BTreeMap;

/// A block may serve a request up to this fraction larger than it (1/8: at most 12.5% of a
/// block unused), so that sizes that differ a little still share blocks.
const FIT_SLACK_DIVISOR: usize = 8;

/// The memory a pool keeps may exceed its peak in use by this fraction (a half): a step's
/// requests come in a mix of sizes, and the blocks in use at its peak are not the blocks
/// each of its moments needs (a block freed early is too large for the next request, which
/// takes a new one); with too little room the pool would release and take blocks every
/// step. A half covers mixes where a third more blocks than the peak are needed.
const HEADROOM_DIVISOR: u64 = 2;

/// Counters of a [`BlockPool`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes of the blocks handed out and not given back.
    pub live_bytes: u64,
    /// Bytes of the idle blocks kept for reuse.
    pub idle_bytes: u64,
    /// The most bytes handed out at once since the pool was made or last trimmed: the pool
    /// keeps at most half again as much memory (handed out plus idle).
    pub peak_live_bytes: u64,
    /// Requests served by an idle block (no fresh memory).
    pub hits: u64,
    /// Requests that took a new block.
    pub misses: u64,
    /// Idle blocks released to make room under the peak, or by [`BlockPool::trim`].
    pub released_blocks: u64,
    /// Their bytes.
    pub released_bytes: u64,
}

/// Idle blocks kept for reuse, best fit by length (the last returned first among equals).
/// Not synchronised: its owner locks it.
///
/// The memory a pool holds, handed out plus idle, stays within half again the most it ever
/// had handed out at once (its peak): when a request finds no idle block that fits,
/// the least recently returned idle blocks are released until the new one fits under that
/// bound (a single request larger than it is still served). So a pool that serves a
/// training step keeps, between steps, about what the step had in use at its peak, and
/// later steps find their blocks already faulted in.
#[derive(Debug, Default)]
pub struct BlockPool {
    /// Idle blocks by (length, return order).
    idle: BTreeMap<(usize, u64), HostBuffer>,
    /// The same blocks by return order (oldest first): what to release first.
    returned: BTreeMap<u64, usize>,
    next_seq: u64,
    stats: PoolStats,
}

impl BlockPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A page-aligned block of at least `len` bytes (rounded up to a page; an idle block
    /// may be up to an eighth larger). Its bytes are stale when it is reused, zero when new.
    pub fn take(&mut self, len: usize) -> Result<HostBuffer> {
        let want = round_up(len.max(1) as u64) as usize;
        let most = want + want / FIT_SLACK_DIVISOR;
        // The smallest length that fits; of those, the block returned last (still warm in
        // the caches).
        let fit = self
            .idle
            .range((want, 0)..=(most, u64::MAX))
            .next()
            .and_then(|(&(len, _), _)| {
                self.idle
                    .range((len, 0)..=(len, u64::MAX))
                    .next_back()
                    .map(|(&k, _)| k)
            });
        if let Some(key) = fit {
            let buf = self.idle.remove(&key).expect("found above");
            self.returned.remove(&key.1);
            self.stats.idle_bytes -= buf.len() as u64;
            self.stats.hits += 1;
            self.hand_out(buf.len());
            return Ok(buf);
        }
        // Room under the bound for the new block: release the oldest idle ones first.
        let live = self.stats.live_bytes;
        let bound = self.bound().max(live + want as u64);
        while live + self.stats.idle_bytes + want as u64 > bound {
            let Some((&seq, &blen)) = self.returned.iter().next() else {
                break;
            };
            self.returned.remove(&seq);
            drop(self.idle.remove(&(blen, seq)));
            self.stats.idle_bytes -= blen as u64;
            self.stats.released_blocks += 1;
            self.stats.released_bytes += blen as u64;
        }
        let buf = HostBuffer::new(want)?;
        self.stats.misses += 1;
        self.hand_out(buf.len());
        Ok(buf)
    }

    /// The most memory the pool keeps: its peak in use and half as much again.
    fn bound(&self) -> u64 {
        let peak = self.stats.peak_live_bytes;
        peak + peak / HEADROOM_DIVISOR
    }

    fn hand_out(&mut self, len: usize) {
        self.stats.live_bytes += len as u64;
        self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.stats.live_bytes);
    }

    /// Takes back a block from [`BlockPool::take`], idle for a later request.
    pub fn give(&mut self, buf: HostBuffer) {
        let len = buf.len();
        self.stats.live_bytes = self.stats.live_bytes.saturating_sub(len as u64);
        if len == 0 || len % EXTENT_ALIGN as usize != 0 {
            return; // not one of ours: freed
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.stats.idle_bytes += len as u64;
        self.returned.insert(seq, len);
        self.idle.insert((len, seq), buf);
    }

    /// Gives up every idle block, and lowers the peak to what is handed out now. Returns the
    /// blocks, for the caller to drop (which releases their memory) outside its lock.
    pub fn trim(&mut self) -> Vec<HostBuffer> {
        let bytes = self.stats.idle_bytes;
        self.stats.released_blocks += self.idle.len() as u64;
        self.stats.released_bytes += bytes;
        self.returned.clear();
        self.stats.idle_bytes = 0;
        self.stats.peak_live_bytes = self.stats.live_bytes;
        std::mem::take(&mut self.idle).into_values().collect()
    }

    /// The counters now.
    pub fn stats(&self) -> PoolStats {
        self.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = EXTENT_ALIGN as usize;

    #[test]
    fn a_block_given_back_serves_a_later_request_of_about_its_size() {
        let mut pool = BlockPool::new();
        let a = pool.take(10 * P - 5).unwrap();
        assert_eq!(a.len(), 10 * P);
        assert_eq!(a.as_ptr() as usize % P, 0);
        let at = a.as_ptr();
        pool.give(a);
        // An eighth smaller still fits the idle block; the same one comes back.
        let b = pool.take(9 * P).unwrap();
        assert_eq!(b.as_ptr(), at);
        assert_eq!(b.len(), 10 * P);
        let s = pool.stats();
        assert_eq!((s.hits, s.misses, s.idle_bytes), (1, 1, 0));
        assert_eq!(s.live_bytes, 10 * P as u64);
        // Much smaller does not take it: a new block.
        pool.give(b);
        let c = pool.take(2 * P).unwrap();
        assert_eq!(c.len(), 2 * P);
        let s = pool.stats();
        assert_eq!((s.hits, s.misses, s.idle_bytes), (1, 2, 10 * P as u64));
    }

    #[test]
    fn stale_bytes_survive_reuse_and_new_blocks_are_zero() {
        let mut pool = BlockPool::new();
        let mut a = pool.take(3 * P).unwrap();
        assert!(a.iter().all(|&b| b == 0));
        a.fill(7);
        pool.give(a);
        let b = pool.take(3 * P).unwrap();
        assert!(b.iter().all(|&x| x == 7));
    }

    #[test]
    fn the_pool_holds_at_most_half_again_its_peak_in_use() {
        let mut pool = BlockPool::new();
        // Peak: 3 blocks of 4 pages at once.
        let held: Vec<_> = (0..3).map(|_| pool.take(4 * P).unwrap()).collect();
        for b in held {
            pool.give(b);
        }
        let s = pool.stats();
        assert_eq!(
            (s.idle_bytes, s.peak_live_bytes),
            (12 * P as u64, 12 * P as u64)
        );
        // Requests of another size evict idle blocks rather than grow past the bound.
        let mut other = Vec::new();
        for _ in 0..4 {
            other.push(pool.take(3 * P).unwrap());
            let s = pool.stats();
            let bound = s.peak_live_bytes + s.peak_live_bytes / 2;
            assert!(s.live_bytes + s.idle_bytes <= bound.max(s.live_bytes));
        }
        let s = pool.stats();
        assert_eq!(s.live_bytes, 12 * P as u64);
        assert_eq!(s.idle_bytes, 4 * P as u64);
        assert_eq!(s.released_blocks, 2);
        for b in other {
            pool.give(b);
        }
        let released = pool.trim();
        assert_eq!(released.iter().map(|b| b.len()).sum::<usize>(), 16 * P);
        let s = pool.stats();
        assert_eq!((s.idle_bytes, s.peak_live_bytes, s.live_bytes), (0, 0, 0));
    }

    #[test]
    fn the_oldest_idle_blocks_go_first() {
        let mut pool = BlockPool::new();
        let blocks: Vec<_> = (0..3).map(|_| pool.take(P).unwrap()).collect();
        let newer: Vec<_> = blocks[1..].iter().map(|b| b.as_ptr()).collect();
        for b in blocks {
            pool.give(b); // returned oldest first
        }
        // Two pages: no idle block fits, and one of the three must go to stay within the
        // bound (three pages and a half).
        let big = pool.take(2 * P).unwrap();
        assert_eq!(pool.stats().released_blocks, 1);
        // The two kept come back the last returned first.
        let kept = [pool.take(P).unwrap(), pool.take(P).unwrap()];
        let mut got: Vec<_> = kept.iter().map(|b| b.as_ptr()).collect();
        got.reverse();
        assert_eq!(got, newer);
        assert_eq!(pool.stats().misses, 4);
        drop(big);
    }

    #[test]
    fn repeated_steps_of_mixed_sizes_stop_taking_new_blocks() {
        let mut pool = BlockPool::new();
        let mut misses = Vec::new();
        for _ in 0..8 {
            // One step: activations of two sizes, some freed early, gradients of a third.
            let a = pool.take(16 * P).unwrap();
            let b = pool.take(4 * P).unwrap();
            let c = pool.take(16 * P).unwrap();
            pool.give(a);
            let d = pool.take(8 * P).unwrap();
            let e = pool.take(4 * P).unwrap();
            pool.give(c);
            let f = pool.take(16 * P).unwrap();
            for x in [b, d, e, f] {
                pool.give(x);
            }
            misses.push(pool.stats().misses);
        }
        assert!(misses[2..].windows(2).all(|w| w[0] == w[1]), "{misses:?}");
        let s = pool.stats();
        assert!(s.idle_bytes <= s.peak_live_bytes + s.peak_live_bytes / 2);
    }
}
