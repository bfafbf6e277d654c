//! [`HostPool`]: page-aligned host memory for what a training step frees and asks for again
//! (activations, their gradients, tensors read back), faulted in once, not every step.
//!
//! Every block is an anonymous mapping of its own. A request is served, in this order:
//! 1. by an idle block of about its size (up to an eighth larger), as it is;
//! 2. by the start of the smallest larger idle block, split in two (the rest stays idle);
//! 3. by moving the pages of idle blocks into a new mapping of its size (`mremap`: their
//!    physical pages change address, nothing is copied or faulted in), the largest idle
//!    blocks first, the last one split;
//! 4. by fresh pages, for what the idle blocks cannot cover.
//!
//! So idle memory is never stranded by its sizes: the memory a pool holds (handed out plus
//! idle) is at most the most it ever had handed out at once, whatever the mix of sizes,
//! and a training loop that repeats its steps stops taking fresh memory after its first
//! step. [`HostPool::trim`] gives the idle blocks back to the system.
//!
//! Blocks are handed out as [`HostBuffer`]s ([`HostPool::take`], back with
//! [`HostPool::give`]) or lent by address to a foreign allocator ([`HostPool::lend`], back
//! with [`HostPool::reclaim`]), which then owns the block until it gives the address back.

use super::allocator::round_up;
use fastensor_core::{HostBuffer, Result};
use fastensor_sys::fork::ForkMutex;
use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;

/// A block may serve a request up to this fraction larger than it (1/8: at most 12.5% of a
/// block unused), so that sizes that differ a little share blocks without moving pages.
const FIT_SLACK_DIVISOR: usize = 8;

/// Counters of a [`HostPool`] (bytes, and counts of requests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes of the blocks handed out or lent and not given back.
    pub live_bytes: u64,
    /// Bytes of the idle blocks kept for reuse.
    pub idle_bytes: u64,
    /// The most bytes the pool held at once (handed out plus idle): what it costs the
    /// process at most.
    pub peak_bytes: u64,
    /// Blocks lent by address now.
    pub lent_blocks: u64,
    /// Requests served by an idle block as it was.
    pub reused: u64,
    /// Requests served by the start of a larger idle block.
    pub split: u64,
    /// Requests served (in part) by moving idle pages into a new block.
    pub remapped: u64,
    /// Bytes moved from idle blocks into new ones.
    pub remapped_bytes: u64,
    /// Requests that took fresh memory.
    pub fresh: u64,
    /// Bytes of fresh memory taken (faulted in by their first use).
    pub fresh_bytes: u64,
    /// Idle bytes given back to the system by [`HostPool::trim`].
    pub released_bytes: u64,
}

/// Page-aligned host blocks kept for reuse (see the module documentation). `Send + Sync`;
/// a child process made by `fork` keeps the pool if no thread held it at the fork, and
/// starts an empty one otherwise.
#[derive(Debug, Default)]
pub struct HostPool {
    state: ForkMutex<State>,
}

#[derive(Default)]
struct State {
    /// Idle blocks by (length, return order).
    idle: BTreeMap<(usize, u64), HostBuffer>,
    /// Blocks lent by address.
    lent: HashMap<usize, HostBuffer>,
    next_seq: u64,
    stats: PoolStats,
}

impl HostPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A block of at least `len` bytes (at least one page, rounded up to whole pages; an
    /// idle block may be up to an eighth larger): its length is the block's. Its bytes are
    /// stale (left by an earlier user) or zero.
    pub fn take(&self, len: usize) -> Result<HostBuffer> {
        self.state.lock().take(len)
    }

    /// Takes back a block (from [`HostPool::take`], or any mapped [`HostBuffer`]), idle for
    /// a later request; a buffer that is not a mapping of its own is freed instead.
    pub fn give(&self, buf: HostBuffer) {
        let dropped = self.state.lock().give(buf);
        drop(dropped);
    }

    /// Lends a block of at least `len` bytes by address: its start, page-aligned. The
    /// borrower owns the memory until it gives the address to [`HostPool::reclaim`].
    pub fn lend(&self, len: usize) -> Result<NonNull<u8>> {
        let mut st = self.state.lock();
        let mut buf = st.take(len)?;
        let ptr = NonNull::new(buf.as_mut_ptr()).expect("a block is never empty");
        st.lent.insert(ptr.as_ptr() as usize, buf);
        st.stats.lent_blocks += 1;
        Ok(ptr)
    }

    /// Takes back the block lent at `addr`; false (and nothing done) when no block is lent
    /// there.
    pub fn reclaim(&self, addr: usize) -> bool {
        let mut st = self.state.lock();
        let Some(buf) = st.lent.remove(&addr) else {
            return false;
        };
        st.stats.lent_blocks -= 1;
        let dropped = st.give(buf);
        drop(st);
        drop(dropped);
        true
    }

    /// The length of the block lent at `addr` (its memory may be read and written up to
    /// there), or `None`.
    pub fn lent_len(&self, addr: usize) -> Option<usize> {
        self.state.lock().lent.get(&addr).map(|b| b.len())
    }

    /// Gives every idle block back to the system; returns the bytes released.
    pub fn trim(&self) -> u64 {
        let idle = {
            let mut st = self.state.lock();
            let bytes = st.stats.idle_bytes;
            st.stats.idle_bytes = 0;
            st.stats.released_bytes += bytes;
            std::mem::take(&mut st.idle)
        };
        // Unmapped outside the lock.
        idle.into_values().map(|b| b.len() as u64).sum()
    }

    /// The counters now.
    pub fn stats(&self) -> PoolStats {
        self.state.lock().stats.clone()
    }
}

impl State {
    fn take(&mut self, len: usize) -> Result<HostBuffer> {
        let want = round_up(len.max(1) as u64) as usize;
        if let Some(buf) = self.take_idle(want) {
            self.stats.reused += 1;
            self.hand_out(buf.len());
            return Ok(buf);
        }
        if let Some(buf) = self.split_idle(want) {
            self.stats.split += 1;
            self.hand_out(buf.len());
            return Ok(buf);
        }
        let mut buf = HostBuffer::mapped_pages(want)?;
        let moved = self.move_idle_into(&mut buf);
        if moved > 0 {
            self.stats.remapped += 1;
            self.stats.remapped_bytes += moved as u64;
        }
        if moved < want {
            self.stats.fresh += 1;
            self.stats.fresh_bytes += (want - moved) as u64;
        }
        self.hand_out(buf.len());
        Ok(buf)
    }

    /// The smallest idle block of `want` to `want + want / 8` bytes; of those, the one
    /// returned last (still warm in the caches).
    fn take_idle(&mut self, want: usize) -> Option<HostBuffer> {
        let most = want + want / FIT_SLACK_DIVISOR;
        let (&(len, _), _) = self.idle.range((want, 0)..=(most, u64::MAX)).next()?;
        let (&key, _) = self.idle.range((len, 0)..=(len, u64::MAX)).next_back()?;
        let buf = self.idle.remove(&key).expect("found above");
        self.stats.idle_bytes -= buf.len() as u64;
        Some(buf)
    }

    /// The first `want` bytes of the smallest idle block larger than that (the rest of it
    /// stays idle, as a block of its own; nothing is moved).
    fn split_idle(&mut self, want: usize) -> Option<HostBuffer> {
        let (&key, _) = self.idle.range((want, 0)..).next()?;
        let mut block = self.idle.remove(&key).expect("found above");
        self.stats.idle_bytes -= block.len() as u64;
        if let Some(rest) = block.split_off(want) {
            self.keep(rest);
        }
        Some(block)
    }

    /// Moves idle pages into `dst` from its start, the largest idle blocks first (the last
    /// one split, its rest staying idle), until `dst` is covered or no idle block is left.
    /// Returns the bytes moved; the rest of `dst` keeps its fresh pages.
    fn move_idle_into(&mut self, dst: &mut HostBuffer) -> usize {
        let want = dst.len();
        let mut filled = 0;
        while filled < want {
            let Some((&key, _)) = self.idle.iter().next_back() else {
                break;
            };
            let block = self.idle.remove(&key).expect("found above");
            let len = block.len();
            self.stats.idle_bytes -= len as u64;
            match dst.take_pages(filled, block) {
                Ok(rest) => {
                    let rest_len = rest.as_ref().map_or(0, |r| r.len());
                    filled += len - rest_len;
                    if let Some(rest) = rest {
                        self.keep(rest);
                    }
                }
                Err(block) => {
                    // Left as it was (too many mappings, say): idle again, and the rest of
                    // `dst` comes fresh.
                    self.keep(block);
                    break;
                }
            }
        }
        filled
    }

    fn hand_out(&mut self, len: usize) {
        self.stats.live_bytes += len as u64;
        let held = self.stats.live_bytes + self.stats.idle_bytes;
        self.stats.peak_bytes = self.stats.peak_bytes.max(held);
    }

    /// Takes a block back; returns what is to be freed (outside the lock) instead.
    fn give(&mut self, buf: HostBuffer) -> Option<HostBuffer> {
        let Some(mapped) = buf.mapped_len() else {
            return Some(buf);
        };
        self.stats.live_bytes = self.stats.live_bytes.saturating_sub(mapped as u64);
        self.keep(buf.whole());
        let held = self.stats.live_bytes + self.stats.idle_bytes;
        self.stats.peak_bytes = self.stats.peak_bytes.max(held);
        None
    }

    /// Adds a whole mapped block to the idle ones.
    fn keep(&mut self, block: HostBuffer) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.stats.idle_bytes += block.len() as u64;
        self.idle.insert((block.len(), seq), block);
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EXTENT_ALIGN;
    use proptest::prelude::*;

    const P: usize = EXTENT_ALIGN as usize;

    #[test]
    fn a_block_given_back_serves_a_later_request_of_about_its_size() {
        let pool = HostPool::new();
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
        assert_eq!((s.reused, s.fresh, s.idle_bytes), (1, 1, 0));
        assert_eq!(s.live_bytes, 10 * P as u64);
    }

    #[test]
    fn a_smaller_request_takes_the_start_of_the_smallest_larger_block() {
        let pool = HostPool::new();
        let (big, small) = (pool.take(16 * P).unwrap(), pool.take(2 * P).unwrap());
        let at = big.as_ptr();
        pool.give(big);
        pool.give(small);
        let mut part = pool.take(4 * P).unwrap();
        assert_eq!((part.as_ptr(), part.len()), (at, 4 * P));
        part.fill(3);
        let s = pool.stats();
        assert_eq!((s.split, s.remapped, s.idle_bytes), (1, 0, 14 * P as u64));
        // The rest of the block serves the next request of its size as it is.
        let rest = pool.take(12 * P).unwrap();
        assert_eq!(rest.as_ptr() as usize, at as usize + 4 * P);
        assert_eq!(pool.stats().reused, 1);
    }

    #[test]
    fn idle_pages_move_into_a_request_that_fits_no_block() {
        let pool = HostPool::new();
        let mut small: Vec<_> = (0..3).map(|_| pool.take(4 * P).unwrap()).collect();
        for (i, b) in small.iter_mut().enumerate() {
            b.fill(i as u8 + 1);
        }
        for b in small {
            pool.give(b);
        }
        let fresh_before = pool.stats().fresh_bytes;
        // Ten pages: two idle blocks moved whole and half of the third, with their bytes;
        // nothing fresh, and the third block's other half stays idle.
        let mut big = pool.take(10 * P).unwrap();
        let s = pool.stats();
        assert_eq!(big.len(), 10 * P);
        assert_eq!((s.remapped, s.remapped_bytes), (1, 10 * P as u64));
        assert_eq!(s.fresh_bytes, fresh_before);
        assert_eq!(s.idle_bytes, 2 * P as u64);
        assert!(big.iter().all(|&b| b != 0));
        // A request of the idle half's size takes it as it is.
        let half = pool.take(2 * P).unwrap();
        assert!(half.iter().all(|&b| b != 0));
        assert_eq!(pool.stats().reused, 1);
        big.fill(9);
        assert!(big.iter().all(|&b| b == 9));
        assert!(pool.stats().peak_bytes <= 12 * P as u64);
    }

    #[test]
    fn lent_blocks_come_back_by_address() {
        let pool = HostPool::new();
        let p = pool.lend(3 * P + 1).unwrap();
        assert_eq!(pool.lent_len(p.as_ptr() as usize), Some(4 * P));
        assert!(!pool.reclaim(p.as_ptr() as usize + P));
        assert!(pool.reclaim(p.as_ptr() as usize));
        assert!(!pool.reclaim(p.as_ptr() as usize));
        let s = pool.stats();
        assert_eq!(
            (s.live_bytes, s.idle_bytes, s.lent_blocks),
            (0, 4 * P as u64, 0)
        );
        assert_eq!(pool.trim(), 4 * P as u64);
        assert_eq!(pool.stats().idle_bytes, 0);
    }

    #[test]
    fn repeated_steps_of_mixed_sizes_stop_taking_fresh_memory() {
        let pool = HostPool::new();
        let mut fresh = Vec::new();
        for step in 0..6 {
            // One step: activations of several sizes, some freed early, gradients of
            // others; the sizes drift a little from step to step.
            let d = step % 2;
            let a = pool.take((16 + d) * P).unwrap();
            let b = pool.take(4 * P).unwrap();
            let c = pool.take(16 * P).unwrap();
            pool.give(a);
            let e = pool.take((24 - d) * P).unwrap();
            pool.give(c);
            let f = pool.take(5 * P).unwrap();
            for x in [b, e, f] {
                pool.give(x);
            }
            fresh.push(pool.stats().fresh_bytes);
        }
        assert!(fresh[2..].windows(2).all(|w| w[0] == w[1]), "{fresh:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the order and sizes of takes and gives, the pool holds at most the
        /// most it had handed out at once, and every block is whole and writable.
        #[test]
        fn the_pool_never_holds_more_than_its_peak_in_use(
            ops in proptest::collection::vec((any::<bool>(), 1usize..40, any::<prop::sample::Index>()), 1..60)
        ) {
            let pool = HostPool::new();
            let mut out: Vec<HostBuffer> = Vec::new();
            let mut live = 0u64;
            let mut most = 0u64;
            for (take, pages, which) in ops {
                if take || out.is_empty() {
                    let mut b = pool.take(pages * P - 1).unwrap();
                    prop_assert!(b.len() >= pages * P);
                    b.fill(pages as u8);
                    live += b.len() as u64;
                    most = most.max(live);
                    out.push(b);
                } else {
                    let b = out.swap_remove(which.index(out.len()));
                    live -= b.len() as u64;
                    pool.give(b);
                }
                let s = pool.stats();
                prop_assert_eq!(s.live_bytes, live);
                prop_assert!(s.live_bytes + s.idle_bytes <= most, "{:?} most {}", s, most);
            }
            for b in &out {
                let v = b[0];
                prop_assert!(b.iter().all(|&x| x == v));
            }
        }
    }
}
