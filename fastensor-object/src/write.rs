//! [`ObjectWriter`]: an object being written. Bytes written are cut into parts; a part is
//! uploaded (in the background, the bucket's limit on requests in flight applying) as soon
//! as every byte of it has been written, and [`sync`](BackendFile::sync) uploads the rest and
//! completes the upload, which is when the object appears, whole. Dropped before that, the
//! upload is aborted.
//!
//! Parts are [`ObjectConfig::part_bytes`](crate::ObjectConfig::part_bytes) long, or longer
//! where the object's length, said by [`set_len`](BackendFile::set_len) before its first
//! byte is written, needs more than S3's 10 000 parts of that size: the part size is then the
//! smallest whole number of MiB that fits the object in 10 000 parts. A length that cannot
//! fit (parts already cut smaller, or over 10 000 parts of S3's largest, 5 GiB) is refused
//! when it is said or written, before any more bytes are uploaded.
//!
//! A failed part is reported only once every other part in flight has finished, and only
//! then is the upload aborted: no part lands after the abort (and stays stored).

use crate::bucket::Bucket;
use crate::config::MAX_PARTS;
use crate::error::{about, from_store};
use bytes::Bytes;
use fastensor_core::{unsupported_memory, BackendFile, Error, ErrorKind, MemMut, MemRef, Result};
use object_store::multipart::PartId;
use object_store::{MultipartId, PutPayload};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// S3's largest part.
const MAX_PART_BYTES: u64 = 5 << 30;

/// The part size of an object of `len` bytes: `configured`, or the smallest whole number of
/// MiB that fits `len` in [`MAX_PARTS`] parts where `configured` does not; `None` where no
/// part S3 takes fits it.
pub(crate) fn part_bytes_for(len: u64, configured: u64) -> Option<u64> {
    let needed = len.div_ceil(MAX_PARTS).next_multiple_of(1 << 20);
    let part = configured.max(needed);
    (len.div_ceil(part) <= MAX_PARTS && (part <= MAX_PART_BYTES || part == configured))
        .then_some(part)
}

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
    /// Bytes of each part but the last: fixed once a byte is written.
    part_bytes: u64,
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
        let part_bytes = bucket.config.part_bytes;
        ObjectWriter {
            bucket,
            key,
            url,
            state: Mutex::new(Upload {
                part_bytes,
                ..Upload::default()
            }),
        }
    }

    /// Bytes of part `idx` in an object of `len` bytes.
    fn part_len(up: &Upload, idx: u64, len: u64) -> u64 {
        let start = idx * up.part_bytes;
        len.saturating_sub(start).min(up.part_bytes)
    }

    /// [`ErrorKind::InvalidInput`]: an object of `len` bytes does not fit in S3's parts.
    fn too_many_parts(&self, up: &Upload, len: u64) -> Error {
        about(
            ErrorKind::InvalidInput,
            format!(
                "an object of {len} bytes needs more than S3's {MAX_PARTS} parts of {} bytes \
                 (its part size is fixed once bytes are written: say its length first, or set \
                 FASTENSOR_S3_PART_BYTES higher)",
                up.part_bytes
            ),
            &self.url,
        )
    }

    /// Sends part `idx` in the background (the upload started first when it has not).
    fn send(&self, up: &mut Upload, idx: u64, bytes: Bytes) -> Result<()> {
        if idx >= MAX_PARTS {
            return Err(self.too_many_parts(up, (idx + 1) * up.part_bytes));
        }
        let b = &self.bucket;
        let id = match &up.id {
            Some(id) => id.clone(),
            None => {
                let id =
                    b.io.block_on(&self.url, b.store.create_multipart(&self.key))?
                        .map_err(|e| from_store(e, &self.url, "write"))?;
                up.id = Some(id.clone());
                id
            }
        };
        let slot =
            b.io.block_on(&self.url, b.in_flight.clone().acquire_owned())?
                .expect("the bucket's semaphore is never closed");
        let store = b.store.clone();
        let key = self.key.clone();
        let part = usize::try_from(idx).expect("a part index under 10 000");
        let task = b.io.spawn(&self.url, async move {
            let sent = store
                .put_part(&key, &id, part, PutPayload::from(bytes))
                .await;
            drop(slot);
            sent
        })?;
        up.sent.insert(idx, task);
        Ok(())
    }

    /// Waits for every part sent so far to finish (uploaded or failed); their part ids in
    /// order, or the first failure, reported only after the last of them finished.
    fn wait_sent(&self, up: &mut Upload) -> Result<Vec<PartId>> {
        let sent = std::mem::take(&mut up.sent);
        let url = &self.url;
        let finished = self
            .bucket
            .io
            .block_on(url, futures::future::join_all(sent.into_values()))?;
        let mut ids = Vec::with_capacity(finished.len());
        let mut failed = None;
        for part in finished {
            match part {
                Ok(Ok(id)) => ids.push(id),
                Ok(Err(e)) => {
                    failed.get_or_insert_with(|| from_store(e, url, "write"));
                }
                Err(e) => {
                    failed.get_or_insert_with(|| {
                        about(ErrorKind::Io, format!("a part's upload failed: {e}"), url)
                    });
                }
            }
        }
        failed.map_or(Ok(ids), Err)
    }

    /// Sends what is left, waits for every part and completes the upload; or puts the object
    /// in one request when it is a single part never sent.
    fn complete(&self, up: &mut Upload) -> Result<()> {
        let parts = up.len.div_ceil(up.part_bytes).max(1);
        let b = &self.bucket;
        if up.id.is_none() && parts == 1 {
            let (mut buf, _) = up.filling.remove(&0).unwrap_or_default();
            buf.resize(up.len as usize, 0);
            b.io.block_on(&self.url, b.store.put(&self.key, PutPayload::from(buf)))?
                .map_err(|e| from_store(e, &self.url, "write"))?;
            return Ok(());
        }
        for idx in 0..parts {
            if up.sent.contains_key(&idx) {
                continue;
            }
            let want = Self::part_len(up, idx, up.len) as usize;
            let (mut buf, _) = up
                .filling
                .remove(&idx)
                .unwrap_or_else(|| (vec![0; want], 0));
            buf.resize(want, 0);
            self.send(up, idx, Bytes::from(buf))?;
        }
        let id = up.id.clone().expect("a part was sent");
        let ids = self.wait_sent(up)?;
        b.io.block_on(&self.url, b.store.complete_multipart(&self.key, &id, ids))?
            .map_err(|e| from_store(e, &self.url, "write"))?;
        up.id = None;
        Ok(())
    }

    /// Aborts the upload once every part in flight has finished (none lands after it; its
    /// parts are deleted); errors are dropped: this runs on failures.
    fn abort(&self, up: &mut Upload) {
        let _ = self.wait_sent(up);
        let Some(id) = up.id.take() else {
            return;
        };
        let b = &self.bucket;
        let _ =
            b.io.block_on(&self.url, b.store.abort_multipart(&self.key, &id));
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
                    crate::backend_of(&self.url),
                    MemRef::Device(d).kind(),
                    &self.url,
                ))
            }
        };
        let mut up = self.state.lock();
        if up.complete {
            return Err(self.refuse("the object is complete: it cannot be written again"));
        }
        let end =
            fastensor_core::write_end(offset, src.len(), crate::backend_of(&self.url), &self.url)?;
        let size = up.part_bytes;
        if end.div_ceil(size) > MAX_PARTS {
            return Err(self.too_many_parts(&up, end).with_offset(offset));
        }
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

    /// Extends the object with zeros; it cannot shrink below what was written. Said before
    /// any byte is written, the length sets the part size (see the module's documentation);
    /// a length that cannot fit in S3's parts is [`ErrorKind::InvalidInput`] at once.
    fn set_len(&self, len: u64) -> Result<()> {
        let mut up = self.state.lock();
        if len < up.len {
            return Err(about(
                ErrorKind::Unsupported,
                "an object being written cannot be cut",
                &self.url,
            ));
        }
        let untouched = up.filling.is_empty() && up.sent.is_empty() && up.id.is_none();
        if untouched {
            match part_bytes_for(len, self.bucket.config.part_bytes) {
                Some(part) => up.part_bytes = part,
                None => return Err(self.too_many_parts(&up, len)),
            }
        } else if len.div_ceil(up.part_bytes) > MAX_PARTS {
            return Err(self.too_many_parts(&up, len));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_part_size_fits_the_object_in_10000_parts() {
        let mib = 1u64 << 20;
        assert_eq!(part_bytes_for(0, 16 * mib), Some(16 * mib));
        assert_eq!(part_bytes_for(156 << 30, 16 * mib), Some(16 * mib));
        for len in [157u64 << 30, 200 << 30, 1 << 40, 5 << 40] {
            let part = part_bytes_for(len, 16 * mib).unwrap();
            assert!(len.div_ceil(part) <= MAX_PARTS, "{len}");
            assert_eq!(part % mib, 0);
            assert!(
                part - mib < len.div_ceil(MAX_PARTS),
                "{len}: the smallest that fits"
            );
        }
        assert_eq!(part_bytes_for(60 << 40, 16 * mib), None);
    }
}
