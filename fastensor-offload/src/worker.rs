//! The background I/O threads: they take jobs from the store's queue, move the bytes
//! through the engine with the store's lock released, and record the outcome.

use super::allocator::round_up;
use super::packing::{self, Layout, Written};
use super::payload::Payload;
use super::shared::{Shared, PINNED_WAIT};
use super::state::{Data, Home, Job};
use fastensor_core::device_copies::OutgoingCopy;
use fastensor_core::{Error, ErrorKind, HostBuffer, MemMut, MemRef, Result};
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
                let result = write_host(shared, offset, &buf);
                let mut st = shared.lock();
                st.stats.write_time += t0.elapsed();
                st.write_done(id, Some(buf), result);
                shared.after_change(&mut st);
            }
            Job::Read {
                id,
                offset,
                layout,
                len,
                home,
            } => {
                let t0 = Instant::now();
                let result = read(shared, offset, layout.as_deref(), len, home);
                let mut st = shared.lock();
                st.stats.read_time += t0.elapsed();
                if st.read_done(id, result) {
                    shared.after_change(&mut st);
                } else {
                    drop(st);
                    shared.notify_changed();
                }
            }
            Job::Stage { id, offset, copy } => stage(shared, id, offset, copy),
            Job::WriteDevice { id, offset, src } => {
                let t0 = Instant::now();
                let result = src
                    .wait_ready()
                    .and_then(|()| shared.file.write_at(offset, MemRef::Device(src.slice())));
                let len = src.range().len() as u64;
                drop(src); // the device memory goes back to its owner once written
                let mut st = shared.lock();
                st.stats.write_time += t0.elapsed();
                st.write_done(id, None, result.map(|()| Written::raw(len)));
                shared.after_change(&mut st);
            }
        }
    }
}

/// Finishes a GPU tensor's copy into its pinned block (its device memory then goes back to
/// its owner) and writes the block (its whole pages).
fn stage(shared: &Shared, id: u64, offset: u64, copy: Box<dyn OutgoingCopy>) {
    let t0 = Instant::now();
    let staged = copy.finish();
    let waited = t0.elapsed();
    let t1 = Instant::now();
    let result = staged.map(|mut block| {
        let len = block.bytes().len();
        block.set_len(round_up(len as u64) as usize);
        let written = shared
            .file
            .write_at(offset, block.bytes())
            .map(|()| Written::raw(block.bytes().len() as u64));
        block.set_len(len);
        (written, Arc::new(Payload::Pinned(block)))
    });
    let mut st = shared.lock();
    st.stats.stage_wait += waited;
    match result {
        Ok((written, buf)) => {
            st.stats.write_time += t1.elapsed();
            if let Some(e) = st.entries.get_mut(&id) {
                e.data = Data::Writing(buf.clone());
            }
            st.write_done(id, Some(buf), written);
        }
        Err(e) => st.write_done(id, None, Err(e)),
    }
    shared.after_change(&mut st);
}

/// Writes a host tensor at `offset`: packed where it packs ([`OffloadConfig::pack`](
/// super::OffloadConfig::pack)), through a scratch block of the pool, else as it is.
pub(crate) fn write_host(shared: &Shared, offset: u64, bytes: &[u8]) -> Result<Written> {
    if !shared.config.pack || bytes.len() < super::codec::MIN_PACKED {
        shared.file.write_at(offset, bytes)?;
        return Ok(Written::raw(bytes.len() as u64));
    }
    let mut scratch = shared.pool.take(packing::write_scratch(bytes.len()))?;
    let result = packing::write(&shared.file, offset, bytes, &mut scratch[..]);
    shared.pool.give(scratch);
    result
}

/// Reads the `len` bytes at `offset` of the swap file (laid out as `layout` says, where the
/// tensor was written packed) into memory of `home`: a block of the store's host pool, a
/// GPU's pinned pool, or device memory. The extent's whole pages are read (with no bounce
/// through a partial page); what is returned holds exactly the `len` bytes, with the bytes
/// read from the file.
pub(crate) fn read(
    shared: &Shared,
    offset: u64,
    layout: Option<&Layout>,
    len: u64,
    home: Home,
) -> Result<(Data, u64)> {
    let n = usize::try_from(len)
        .map_err(|_| Error::new(ErrorKind::InvalidInput, "tensor too large for memory"))?;
    match home {
        Home::Host => read_host(shared, offset, layout, n)
            .map(|(b, moved)| (Data::Loaded(Payload::Owned(b)), moved)),
        Home::Pinned(gpu) => {
            let engine = shared.copies(gpu)?;
            let mut block = engine.take_pinned(n, PINNED_WAIT)?;
            block.set_len(round_up(len) as usize);
            let got = shared.file.read_at(offset, block.bytes_mut())?;
            block.set_len(n);
            complete(shared, offset, n, got)?;
            Ok((Data::Loaded(Payload::Pinned(block)), got as u64))
        }
        Home::Device(gpu) => {
            let mut buf = shared.runtime()?.alloc(n, gpu)?;
            let got = shared
                .file
                .read_at(offset, MemMut::Device(buf.device_slice_mut()))?;
            complete(shared, offset, n, got)?;
            Ok((Data::LoadedDevice(buf), got as u64))
        }
    }
}

/// Reads the `n` bytes of a tensor at `offset` (laid out as `layout` says) into a block of
/// the store's host pool; the block, and the bytes read from the file.
fn read_host(
    shared: &Shared,
    offset: u64,
    layout: Option<&Layout>,
    n: usize,
) -> Result<(HostBuffer, u64)> {
    let mut buf = shared.pool.take(n)?;
    let span = (round_up(n as u64) as usize).min(buf.len());
    let got = match layout {
        None => shared
            .file
            .read_at(offset, &mut buf[..span])
            .and_then(|got| complete(shared, offset, n, got).map(|()| got as u64)),
        Some(layout) => shared
            .pool
            .take(layout.read_scratch(n))
            .and_then(|mut scratch| {
                let got = packing::read(
                    &shared.file,
                    &shared.path,
                    offset,
                    layout,
                    n,
                    &mut buf[..span],
                    &mut scratch[..],
                );
                shared.pool.give(scratch);
                got
            }),
    };
    match got {
        Ok(got) => {
            buf.truncate(n);
            Ok((buf, got))
        }
        Err(e) => {
            shared.pool.give(buf);
            Err(e)
        }
    }
}

/// An error unless `got` bytes read cover the `n` wanted.
fn complete(shared: &Shared, offset: u64, n: usize, got: usize) -> Result<()> {
    packing::complete(&shared.path, offset, n, got)
}
