//! The background I/O threads: they take jobs from the store's queue, move the bytes
//! through the engine with the store's lock released, and record the outcome.

use super::allocator::round_up;
use super::state::{Data, Job};
use super::store::Shared;
use fastensor_core::{Error, ErrorKind, HostBuffer, Result};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Starts `n` I/O threads on `shared`.
pub(crate) fn spawn(shared: &Arc<Shared>, n: usize) -> Result<Vec<JoinHandle<()>>> {
    (0..n.max(1))
        .map(|i| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("fastensor-offload-{i}"))
                .spawn(move || run(&s))
                .map_err(|e| Error::io(e, "start an offload I/O thread"))
        })
        .collect()
}

/// The loop of one I/O thread; returns at shutdown.
fn run(shared: &Shared) {
    loop {
        let job = {
            let mut st = shared.lock();
            loop {
                if st.shutdown {
                    return;
                }
                if let Some(job) = st.jobs.pop_front() {
                    if let Job::Read { id, .. } = &job {
                        if let Some(e) = st.entries.get_mut(id) {
                            e.data = Data::Reading;
                        }
                    }
                    break job;
                }
                st = shared.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        match job {
            Job::Write { id, offset, buf } => {
                let t0 = Instant::now();
                let result = shared.file.write_at(offset, &buf[..]);
                let mut st = shared.lock();
                st.stats.write_time += t0.elapsed();
                st.write_done(id, buf, result);
                shared.after_change(&mut st);
            }
            Job::Read { id, offset, len } => {
                let t0 = Instant::now();
                let result = read(shared, offset, len);
                let mut st = shared.lock();
                st.stats.read_time += t0.elapsed();
                st.read_done(id, result);
                shared.after_change(&mut st);
            }
        }
    }
}

/// Reads the `len` bytes at `offset` of the swap file into a block of the store's pool:
/// the extent's whole pages are read (with no bounce through a partial page), and the
/// buffer returned holds exactly the `len` bytes.
pub(crate) fn read(shared: &Shared, offset: u64, len: u64) -> Result<HostBuffer> {
    let n = usize::try_from(len)
        .map_err(|_| Error::new(ErrorKind::InvalidInput, "tensor too large for memory"))?;
    let mut buf = shared.pool.take(n)?;
    let span = (round_up(len) as usize).min(buf.len());
    let result = shared.file.read_at(offset, &mut buf[..span]);
    let got = match result {
        Ok(got) => got,
        Err(e) => {
            shared.pool.give(buf);
            return Err(e);
        }
    };
    if got < n {
        shared.pool.give(buf);
        return Err(Error::new(
            ErrorKind::UnexpectedEof,
            format!("wanted {n} bytes, the swap file ended after {got}"),
        )
        .with_path(&shared.path)
        .with_offset(offset));
    }
    buf.truncate(n);
    Ok(buf)
}
