//! GPU tensors in an [`OffloadStore`]: put from device memory, got back into device memory,
//! both ordered on streams; the host never synchronizes a device for them.
//!
//! Two paths, chosen per store ([`DevicePath`]):
//! - **staged**: a copy out of device memory into a block of the GPU's pinned pool, on a
//!   copy stream of the store's that first waits for the producer's work; an I/O thread
//!   waits for that copy's event, gives the device memory back, and writes the block
//!   through the fastest host path (whole pages, no bounce). Reads back land in pinned
//!   blocks; a get copies its block into the caller's device memory on the caller's stream,
//!   and the block goes back to the pool once that copy's event has passed. Pinned blocks
//!   count against the store's budget.
//! - **direct**: an I/O thread waits for the producer's work, writes the device memory
//!   through the engine (cuFile where it moves device memory itself), then gives it back;
//!   reads back land in device memory of the store's, copied into the caller's on the
//!   caller's stream. Device memory held counts against the device budget.
//!
//! The copies, pinned blocks, device memory and events are the store's device runtime's
//! ([`OffloadConfig::device_runtime`](super::OffloadConfig::device_runtime), the traits of
//! [`fastensor_core::device_copies`]); without one, GPU tensors are
//! [`ErrorKind::Unsupported`].

use super::packing::Written;
use super::state::Taken;
use super::state::{Data, Home, Job};
use super::{Handle, OffloadStore, Payload, PINNED_WAIT};
use fastensor_core::device_copies::{
    DeviceCopies, DeviceDest, DeviceEvent, DeviceRuntime, DeviceSource, PinnedBytes, PinnedStats,
    StreamRef,
};
use fastensor_core::{Error, ErrorKind, MemRef, Result};
use std::sync::Arc;
use std::time::Instant;

/// How GPU tensors reach the swap file (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DevicePath {
    /// Direct where files take device memory without a copy through host memory (cuFile in
    /// GPUDirect Storage mode, not its compatibility mode: the device runtime's
    /// [`DeviceRuntime::writes_device_memory_directly`]), else staged.
    #[default]
    Auto,
    /// Through the GPU's pinned pool and the fastest host path.
    Staged,
    /// From and to device memory through the engine.
    Direct,
}

impl std::str::FromStr for DevicePath {
    type Err = fastensor_core::Error;

    /// `auto`, `staged` or `direct`; anything else is
    /// [`ErrorKind::InvalidInput`](fastensor_core::ErrorKind::InvalidInput) saying so.
    fn from_str(s: &str) -> fastensor_core::Result<Self> {
        match s {
            "auto" => Ok(DevicePath::Auto),
            "staged" => Ok(DevicePath::Staged),
            "direct" => Ok(DevicePath::Direct),
            other => Err(fastensor_core::Error::new(
                fastensor_core::ErrorKind::InvalidInput,
                format!("device_path is 'auto', 'staged' or 'direct', not {other:?}"),
            )),
        }
    }
}

impl std::fmt::Display for DevicePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DevicePath::Auto => "auto",
            DevicePath::Staged => "staged",
            DevicePath::Direct => "direct",
        })
    }
}

impl DevicePath {
    /// Whether this path writes from device memory, on this machine (as `runtime` says).
    fn direct(self, runtime: &dyn DeviceRuntime) -> bool {
        match self {
            DevicePath::Direct => true,
            DevicePath::Staged => false,
            DevicePath::Auto => runtime.writes_device_memory_directly(),
        }
    }
}

impl OffloadStore {
    /// Offloads a GPU tensor under `label` and returns at once. One of the last GPU tensors
    /// put ([`OffloadConfig::device_write_behind`](super::OffloadConfig::device_write_behind))
    /// stays in its own device memory, as lent, until later puts on its GPU pass that limit;
    /// then (or at once, beyond the limit) its device memory is read once the producer's
    /// work `src` names has passed: copied out (held until then) or written (the direct
    /// path). Copying out waits first when the budget of the tensor's path has no room
    /// (after dropping the kept tensors needed least); a tensor larger than that budget is
    /// written through from device memory on the caller's thread (which waits for the
    /// producer's work), and read back into device memory when got. Fails as
    /// [`OffloadStore::put`] does, where the store has no device runtime
    /// ([`ErrorKind::Unsupported`]), and where the GPU's copies cannot be set up (no CUDA; a
    /// driver without stream-ordered events). An older tensor this put copies out whose
    /// copy fails keeps the failure: its `get` raises it, and the next put reports it.
    ///
    /// `src`'s event, recorded when it was put, is all a later copy needs: the tensor's bytes
    /// were produced before it, and the store's copies run on one stream, after every
    /// earlier wait queued there.
    pub fn put_device(&self, src: DeviceSource, label: impl Into<String>) -> Result<Handle> {
        let s = &self.shared;
        let range = src.range();
        let (gpu, len) = (range.ordinal(), range.len() as u64);
        let home = self.device_home(gpu)?;
        let (mut st, handle, mut entry) = self.begin_put(len, label.into(), home)?;
        st.stats.device_puts += 1;
        let id = handle.id;
        if len > st.room(home).1 {
            // Written from device memory and read back into it: no pinned block could hold
            // it within the budget.
            let extent = s.extent_for(&mut st, len)?;
            entry.extent = Some(extent);
            entry.home = Home::Device(gpu);
            st.entries.insert(id, entry);
            drop(st);
            return self.write_device_through(handle, extent.offset, &src);
        }
        let limit = s.config.device_write_behind_bytes();
        if len <= limit {
            st.insert_on_device(id, gpu, entry, src);
            let older = st.device_overflow(Some(gpu), limit);
            drop(st);
            self.send_older(older);
            return Ok(handle);
        }
        entry.data = Data::Staging;
        st.entries.insert(id, entry);
        drop(st);
        if let Err(err) = self.send_device(id, src) {
            let e = Error::new(
                err.kind(),
                format!(
                    "tensor `{}` was not stored: {}",
                    handle.label,
                    err.message()
                ),
            )
            .with_source(err);
            drop(handle);
            return Err(e);
        }
        Ok(handle)
    }

    /// Where GPU `gpu`'s tensors live while the store holds them: pinned blocks (staged) or
    /// device memory of the store's (direct). Fails where GPU tensors cannot be stored here.
    fn device_home(&self, gpu: u32) -> Result<Home> {
        let s = &self.shared;
        if s.config.device_path.direct(s.runtime()?.as_ref()) {
            return Ok(Home::Device(gpu));
        }
        s.copies(gpu).map_err(|err| {
            Error::new(err.kind(), "GPU tensors cannot be offloaded here").with_source(err)
        })?;
        Ok(Home::Pinned(gpu))
    }

    /// Copies out and writes the GPU tensors a put took off their device
    /// ([`State::device_overflow`](super::state::State::device_overflow)); a failure stays
    /// with its tensor.
    pub(crate) fn send_older(&self, older: Vec<(u64, DeviceSource)>) {
        for (id, src) in older {
            if let Err(err) = self.send_device(id, src) {
                let mut st = self.shared.lock();
                st.record_failure(id, &err, "copy out of device memory");
                self.shared.after_change(&mut st);
            }
        }
    }

    /// Sends the GPU tensor `id` (its entry [`Data::Staging`], no bytes held yet) on its way
    /// to the swap file: once its path's budget has room, an extent, then a job of an I/O
    /// thread (the direct path), or a copy into a pinned block and its job. On failure the
    /// entry holds no bytes ([`Data::OnDisk`]) and the error is returned.
    fn send_device(&self, id: u64, src: DeviceSource) -> Result<()> {
        let s = &self.shared;
        let st = s.lock();
        let (home, len) = (st.entries[&id].home, st.entries[&id].len);
        let mut st = s.wait_for_room(st, home, len);
        let extent = match s.extent_for(&mut st, len) {
            Ok(x) => x,
            Err(err) => {
                if let Some(e) = st.entries.get_mut(&id) {
                    e.data = Data::OnDisk;
                }
                s.after_change(&mut st);
                return Err(err);
            }
        };
        st.hold_in(home, len);
        let e = st.entries.get_mut(&id).expect("entries being sent stay");
        e.extent = Some(extent);
        let Home::Pinned(gpu) = home else {
            let src = Arc::new(src);
            e.data = Data::WritingDevice(src.clone());
            st.jobs.push_back(Job::WriteDevice {
                id,
                offset: extent.offset,
                src,
            });
            s.work.notify_one();
            return Ok(());
        };
        drop(st);
        // The room is reserved: the pinned block is taken with the lock released (it may
        // wait for copies into device memory to give theirs back).
        let copy = s.copies(gpu).and_then(|engine| {
            engine
                .take_pinned(len as usize, PINNED_WAIT)
                .and_then(|block| engine.copy_out(src, block))
        });
        let mut st = s.lock();
        match copy {
            Ok(copy) => {
                st.stats.bytes_to_host += len;
                st.jobs.push_back(Job::Stage {
                    id,
                    offset: extent.offset,
                    copy,
                });
                s.work.notify_one();
                Ok(())
            }
            Err(err) => {
                st.unhold(home, len);
                if let Some(e) = st.entries.get_mut(&id) {
                    e.data = Data::OnDisk;
                }
                s.after_change(&mut st);
                Err(Error::new(
                    err.kind(),
                    "its copy out of device memory failed".to_string(),
                )
                .with_source(err))
            }
        }
    }

    /// Writes a GPU tensor larger than its budget from device memory on the caller's thread.
    fn write_device_through(
        &self,
        handle: Handle,
        offset: u64,
        src: &DeviceSource,
    ) -> Result<Handle> {
        let t0 = Instant::now();
        let result = src.wait_ready().and_then(|()| {
            self.shared
                .file
                .write_at(offset, MemRef::Device(src.slice()))
                .map(|()| Written::raw(src.slice().len() as u64))
        });
        self.written_through(handle, t0, result)
    }

    /// Copies the tensor into `dest` (device memory of the tensor's length) on `dest`'s
    /// stream and returns at once: its later work sees the bytes, and the host never waits
    /// for the device. The bytes come as [`OffloadStore::get`]'s do (from memory when there,
    /// else read now), then: from a pinned block (back to its pool once the copy has
    /// passed), from device memory of the store's, or from the tensor's own memory (not
    /// written yet). A host tensor is staged through a pinned block. Without a device runtime
    /// this is [`ErrorKind::Unsupported`].
    pub fn get_into_device(&self, handle: &Handle, dest: &DeviceDest) -> Result<()> {
        let s = &self.shared;
        if dest.range().len() as u64 != handle.len {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "tensor `{}` holds {} bytes, not the {} of the destination",
                    handle.label,
                    handle.len,
                    dest.range().len()
                ),
            ));
        }
        let runtime = s.runtime()?;
        let engine = s.copies(dest.range().ordinal())?;
        let taken = self.take(handle, true)?;
        let gpu = engine.ordinal();
        let result = match taken {
            Taken::Payload(Payload::Pinned(block)) => engine.copy_in(block, dest),
            Taken::Payload(other) => stage(&*engine, &other).and_then(|b| engine.copy_in(b, dest)),
            Taken::Shared(bytes) => stage(&*engine, &bytes).and_then(|b| engine.copy_in(b, dest)),
            Taken::Device(buf) if buf.range().ordinal() == gpu => engine.copy_device(buf, dest),
            Taken::Source(src) if src.range().ordinal() == gpu => engine.copy_source(src, dest),
            // Device memory of another GPU: through a pinned block, copied out synchronously
            // on that GPU (the destination's stream still never waits on the host).
            Taken::Device(buf) => {
                let mut block = engine.take_pinned(buf.range().len(), PINNED_WAIT)?;
                runtime
                    .copy_to_host(buf.device_slice(), block.bytes_mut())
                    .and_then(|()| engine.copy_in(block, dest))
            }
            Taken::Source(src) => {
                let mut block = engine.take_pinned(src.range().len(), PINNED_WAIT)?;
                src.wait_ready()
                    .and_then(|()| runtime.copy_to_host(src.slice(), block.bytes_mut()))
                    .and_then(|()| engine.copy_in(block, dest))
            }
        };
        let mut st = s.lock();
        match &result {
            Ok(()) => {
                st.stats.device_gets += 1;
                st.stats.bytes_to_device += handle.len;
            }
            Err(_) => st.stats.errors += 1,
        }
        result.map_err(|err| {
            Error::new(
                err.kind(),
                format!(
                    "tensor `{}`: the copy into device memory failed",
                    handle.label
                ),
            )
            .with_source(err)
        })
    }
}

impl OffloadStore {
    /// The stream of the store's copies of GPU `gpu` (made on first use; it lives as long as
    /// the store): a producer that orders its work on a tensor before the work queued on
    /// this stream (DLPack's stream handshake) may then put the tensor with
    /// [`OffloadStore::ready_after_handshake`].
    pub fn copy_stream(&self, gpu: u32) -> Result<StreamRef> {
        Ok(self.shared.copies(gpu)?.stream())
    }

    /// The end of the work ordered on [`OffloadStore::copy_stream`] so far: a tensor
    /// handed over with the stream handshake is ready once it has passed.
    pub fn ready_after_handshake(&self, gpu: u32) -> Result<Box<dyn DeviceEvent>> {
        self.shared.copies(gpu)?.record()
    }

    /// The counters of GPU `gpu`'s pinned pool, once a tensor of that GPU was put here.
    pub fn pinned_stats(&self, gpu: u32) -> Option<PinnedStats> {
        self.shared.copies_made(gpu).map(|e| e.pinned_stats())
    }
}

/// A pinned block of `engine`'s pool holding a copy of `bytes`.
fn stage(engine: &dyn DeviceCopies, bytes: &[u8]) -> Result<Box<dyn PinnedBytes>> {
    let mut block = engine.take_pinned(bytes.len(), PINNED_WAIT)?;
    block.bytes_mut().copy_from_slice(bytes);
    Ok(block)
}

#[cfg(test)]
mod tests {
    use super::DevicePath;

    #[test]
    fn device_paths_are_parsed_by_their_names_and_nothing_else() {
        for path in [DevicePath::Auto, DevicePath::Staged, DevicePath::Direct] {
            assert_eq!(path.to_string().parse::<DevicePath>().unwrap(), path);
        }
        for bad in ["", "Direct", "gds", "auto "] {
            let e = bad.parse::<DevicePath>().unwrap_err();
            assert_eq!(e.kind(), fastensor_core::ErrorKind::InvalidInput, "{bad:?}");
            assert!(
                e.to_string().contains("'auto', 'staged' or 'direct'"),
                "{e}"
            );
        }
    }
}
