//! [`ObjectWriter`]: an object being written. Bytes written are cut into parts of the
//! configured size; a part is uploaded (in the background, the bucket's limit on requests in
//! flight applying) as soon as every byte of it has been written, and
//! [`sync`](BackendFile::sync) uploads the rest and completes the upload, which is when the
//! object appears, whole. Dropped before that, the upload is aborted.

use crate::bucket::Bucket;
use crate::config::MAX_PARTS;
use crate::error::{about, from_store};
use bytes::Bytes;
use fastensor_core::{unsupported_memory, BackendFile, Error, ErrorKind, MemMut, MemRef, Result};
use object_store::multipart::{MultipartStore, PartId};
use object_store::{MultipartId, ObjectStore, PutPayload};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// An object being written: see the module's documentation. Each byte is written once
/// (a second write of a byte already uploaded is [`ErrorKind::InvalidInput`]); bytes never
/// written read as zeros, as in a file.
#[derive(Debug)]
pub(crate) struct ObjectWriter {
    bucket: Arc<Bucket>,
    key: object_store::path::Path,
    url: PathBuf,
    state: Mutex<Upload>,
}

/// Where an upload is.
#[derive(Debug, Default)]
struct Upload {
    /// The multipart upload, once its first part went out.
    id: Option<MultipartId>,
    /// Parts being filled: their bytes, and how many of them were written.
    filling: BTreeMap<u64, (Vec<u8>, u64)>,
    /// Parts sent (or being sent).
    sent: BTreeMap<u64, JoinHandle<object_store::Result<PartId>>>,
    /// The object's length: the end of the furthest write, or what `set_len` said.
    len: u64,
    /// True once the object was completed.
    complete: bool,
}

impl ObjectWriter {
    /// A new object at `key`; nothing is sent until a part is whole.
    pub(crate) fn new(bucket: Arc<Bucket>, key: object_store::path::Path, url: PathBuf) -> Self {
        ObjectWriter {
            bucket,
            key,
            url,
            state: Mutex::new(Upload::default()),
        }
    }

    fn part_bytes(&self) -> u64 {
        self.bucket.config.part_bytes
    }

    /// Bytes of part `idx` in an object of `len` bytes.
    fn part_len(&self, idx: u64, len: u64) -> u64 {
        let start = idx * self.part_bytes();
        len.saturating_sub(start).min(self.part_bytes())
    }

    /// Sends part `idx` in the background (the upload started first when it has not).
    fn send(&self, up: &mut Upload, idx: u64, bytes: Bytes) -> Result<()> {
        if idx >= MAX_PARTS {
            return Err(about(
                ErrorKind::InvalidInput,
                format!(
                    "the object needs more than S3's {MAX_PARTS} parts of {} bytes: set \
                     FASTENSOR_S3_PART_BYTES higher",
                    self.part_bytes()
                ),
                &self.url,
            ));
        }
        let b = &self.bucket;
        let id = match &up.id {
            Some(id) => id.clone(),
            None => {
                let id = b
                    .runtime
                    .block_on(b.store.create_multipart(&self.key))
                    .map_err(|e| from_store(e, &self.url, "write"))?;
                up.id = Some(id.clone());
                id
            }
        };
        let slot = b
            .runtime
            .block_on(b.in_flight.clone().acquire_owned())
            .expect("the bucket's semaphore is never closed");
        let store = b.store.clone();
        let key = self.key.clone();
        let part = usize::try_from(idx).expect("a part index under 10 000");
        let task = b.runtime.spawn(async move {
            let sent = store
                .put_part(&key, &id, part, PutPayload::from(bytes))
                .await;
            drop(slot);
            sent
        });
        up.sent.insert(idx, task);
        Ok(())
    }

    /// Sends what is left, waits for every part and completes the upload; or puts the object
    /// in one request when it is a single part never sent.
    fn complete(&self, up: &mut Upload) -> Result<()> {
        let parts = up.len.div_ceil(self.part_bytes()).max(1);
        let b = &self.bucket;
        if up.id.is_none() && parts == 1 {
            let (mut buf, _) = up.filling.remove(&0).unwrap_or_default();
            buf.resize(up.len as usize, 0);
            b.runtime
                .block_on(b.store.put(&self.key, PutPayload::from(buf)))
                .map_err(|e| from_store(e, &self.url, "write"))?;
            return Ok(());
        }
        for idx in 0..parts {
            if up.sent.contains_key(&idx) {
                continue;
            }
            let want = self.part_len(idx, up.len) as usize;
            let (mut buf, _) = up
                .filling
                .remove(&idx)
                .unwrap_or_else(|| (vec![0; want], 0));
            buf.resize(want, 0);
            self.send(up, idx, Bytes::from(buf))?;
        }
        let id = up.id.clone().expect("a part was sent");
        let sent = std::mem::take(&mut up.sent);
        let url = &self.url;
        b.runtime.block_on(async {
            let mut ids = Vec::with_capacity(sent.len());
            for (_, task) in sent {
                let part = task
                    .await
                    .map_err(|e| about(ErrorKind::Io, format!("a part's upload failed: {e}"), url))?
                    .map_err(|e| from_store(e, url, "write"))?;
                ids.push(part);
            }
            b.store
                .complete_multipart(&self.key, &id, ids)
                .await
                .map_err(|e| from_store(e, url, "write"))
        })?;
        up.id = None;
        Ok(())
    }

    /// Aborts the upload (its parts deleted); errors are dropped: this runs on failures.
    fn abort(&self, up: &mut Upload) {
        let Some(id) = up.id.take() else {
            return;
        };
        let b = &self.bucket;
        for (_, task) in std::mem::take(&mut up.sent) {
            task.abort();
        }
        let _ = b.runtime.block_on(b.store.abort_multipart(&self.key, &id));
    }

    fn refuse(&self, what: &str) -> Error {
        about(ErrorKind::InvalidInput, what.to_string(), &self.url)
    }
}

impl BackendFile for ObjectWriter {
    fn path(&self) -> &Path {
        &self.url
    }

    fn read_at(&self, offset: u64, _dst: MemMut<'_>) -> Result<usize> {
        Err(about(
            ErrorKind::Unsupported,
            "an object being written cannot be read before it is complete",
            &self.url,
        )
        .with_offset(offset))
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let src = match src {
            MemRef::Host(h) => h,
            MemRef::Device(d) => {
                return Err(unsupported_memory(
                    crate::BACKEND,
                    MemRef::Device(d).kind(),
                    &self.url,
                ))
            }
        };
        let mut up = self.state.lock();
        if up.complete {
            return Err(self.refuse("the object is complete: it cannot be written again"));
        }
        let end = fastensor_core::write_end(offset, src.len(), crate::BACKEND, &self.url)?;
        let size = self.part_bytes();
        let mut at = offset;
        while at < end {
            let idx = at / size;
            let part_start = idx * size;
            let n = (part_start + size).min(end) - at;
            let bytes = &src[(at - offset) as usize..(at - offset + n) as usize];
            if up.sent.contains_key(&idx) {
                return Err(self
                    .refuse("bytes of an object were written twice")
                    .with_offset(at));
            }
            let whole = n == size && !up.filling.contains_key(&idx);
            if whole {
                self.send(&mut up, idx, Bytes::copy_from_slice(bytes))?;
            } else {
                let (buf, filled) = up
                    .filling
                    .entry(idx)
                    .or_insert_with(|| (vec![0; size as usize], 0));
                let from = (at - part_start) as usize;
                buf[from..from + n as usize].copy_from_slice(bytes);
                *filled += n;
                if *filled >= size {
                    let (buf, _) = up.filling.remove(&idx).expect("just filled");
                    self.send(&mut up, idx, Bytes::from(buf))?;
                }
            }
            at += n;
        }
        up.len = up.len.max(end);
        Ok(())
    }

    /// Completes the object: it appears now, whole. A failure aborts the upload (no object,
    /// no parts left). Syncing a complete object again does nothing.
    fn sync(&self) -> Result<()> {
        let mut up = self.state.lock();
        if up.complete {
            return Ok(());
        }
        match self.complete(&mut up) {
            Ok(()) => {
                up.complete = true;
                Ok(())
            }
            Err(e) => {
                self.abort(&mut up);
                up.complete = true;
                Err(e)
            }
        }
    }

    fn len(&self) -> Result<u64> {
        Ok(self.state.lock().len)
    }

    /// Extends the object with zeros; it cannot shrink below what was written.
    fn set_len(&self, len: u64) -> Result<()> {
        let mut up = self.state.lock();
        if len < up.len {
            return Err(about(
                ErrorKind::Unsupported,
                "an object being written cannot be cut",
                &self.url,
            ));
        }
        up.len = len;
        Ok(())
    }
}

impl Drop for ObjectWriter {
    /// An upload never completed is aborted: nothing of it stays on the server.
    fn drop(&mut self) {
        let mut up = self.state.lock();
        if !up.complete {
            self.abort(&mut up);
        }
    }
}
