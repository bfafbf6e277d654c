//! Buffers of tensors read back, given back once their user is done with them, for later
//! reads of the same length: memory already faulted in, where fresh memory costs its page
//! faults on every use (0.6-1.8 CPU s per GiB on some virtual machines), up to a bound.

use fastensor_core::{HostBuffer, Result};
use std::sync::{Arc, Mutex};

/// Spare read-back buffers of one store, shared with whoever holds its buffers (a handle
/// to them stays valid after the store closed; the spares are freed with the last one).
#[derive(Debug, Clone)]
pub struct Recycler {
    spares: Arc<Mutex<Spares>>,
}

#[derive(Debug)]
struct Spares {
    buffers: Vec<HostBuffer>,
    bytes: u64,
    /// The most bytes kept.
    cap: u64,
}

impl Recycler {
    /// Keeps at most `cap` bytes of spare buffers.
    pub(crate) fn new(cap: u64) -> Recycler {
        Recycler {
            spares: Arc::new(Mutex::new(Spares {
                buffers: Vec::new(),
                bytes: 0,
                cap,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Spares> {
        self.spares.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of exactly `len` bytes: a spare one when there is one (holding stale bytes,
    /// to be overwritten whole), else a new one.
    pub(crate) fn take(&self, len: usize) -> Result<HostBuffer> {
        {
            let mut s = self.lock();
            if let Some(i) = s.buffers.iter().position(|b| b.len() == len) {
                let buf = s.buffers.swap_remove(i);
                s.bytes -= len as u64;
                return Ok(buf);
            }
        }
        HostBuffer::new(len)
    }

    /// Keeps `buf` for a later read of its length; frees it instead when the spares would
    /// exceed their bound.
    pub fn give(&self, buf: HostBuffer) {
        let len = buf.len() as u64;
        let mut s = self.lock();
        if len > 0 && s.bytes + len <= s.cap {
            s.bytes += len;
            s.buffers.push(buf);
        }
    }

    /// Bytes of the spare buffers kept now.
    pub fn spare_bytes(&self) -> u64 {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_serves_the_next_take_of_its_length_within_the_bound() {
        let r = Recycler::new(3 * 4096);
        let a = r.take(4096).unwrap();
        let at = a.as_ptr();
        r.give(a);
        assert_eq!(r.spare_bytes(), 4096);
        // Another length gets a new buffer; the same length the one given back.
        let b = r.take(8192).unwrap();
        assert_eq!(r.take(4096).unwrap().as_ptr(), at);
        assert_eq!(r.spare_bytes(), 0);
        r.give(b);
        r.give(HostBuffer::new(8192).unwrap()); // over the bound: freed
        assert_eq!(r.spare_bytes(), 8192);
    }
}
