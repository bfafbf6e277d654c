//! [`ObjectFile`]: an object opened for reading. Its size and ETag are asked for once; every
//! read is ranged GETs, in flight together, each copied into its part of the destination as
//! the bytes arrive.

use crate::bucket::Bucket;
use crate::error::{about, from_store};
use bytes::Bytes;
use fastensor_core::{
    readable_len, unsupported_memory, BackendFile, ErrorKind, MemMut, MemRef, ReadRequest, Result,
};
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An object opened for reading: its length and ETag as they were when opened. A read that
/// finds the object replaced since is [`ErrorKind::Changed`].
#[derive(Debug)]
pub(crate) struct ObjectFile {
    bucket: Arc<Bucket>,
    key: object_store::path::Path,
    url: PathBuf,
    len: u64,
    etag: Option<String>,
}

impl ObjectFile {
    /// The object at `key`: its size and ETag asked for (one HEAD).
    pub(crate) fn open(
        bucket: Arc<Bucket>,
        key: object_store::path::Path,
        url: PathBuf,
    ) -> Result<Self> {
        let meta = bucket
            .io
            .block_on(&url, bucket.store.head(&key))?
            .map_err(|e| from_store(e, &url, "read"))?;
        Ok(ObjectFile {
            len: meta.size,
            etag: meta.e_tag,
            bucket,
            key,
            url,
        })
    }

    /// The object's ETag when it was opened (its version), where the server gave one.
    pub(crate) fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    /// Reads `dst.len()` bytes at `offset` (inside the object) in one ranged GET, once a
    /// request slot of the bucket is free; the bytes go into `dst` as they arrive.
    async fn get_into(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let _slot = self
            .bucket
            .in_flight
            .acquire()
            .await
            .expect("the bucket's semaphore is never closed");
        let end = offset + dst.len() as u64;
        let options = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            if_match: self.etag.clone(),
            ..Default::default()
        };
        let got = self
            .bucket
            .store
            .get_opts(&self.key, options)
            .await
            .map_err(|e| self.error(e, offset))?;
        if got.meta.e_tag.is_some() && got.meta.e_tag != self.etag {
            return Err(self.changed(offset));
        }
        if got.range != (offset..end) {
            return Err(about(
                ErrorKind::Corrupt,
                format!(
                    "asked for bytes {offset}..{end}, the server sent {:?}",
                    got.range
                ),
                &self.url,
            )
            .with_offset(offset));
        }
        let mut at = 0usize;
        let mut body = got.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk: Bytes = chunk.map_err(|e| self.error(e, offset + at as u64))?;
            let Some(place) = dst.get_mut(at..at + chunk.len()) else {
                return Err(self.short(offset, "more bytes than asked for"));
            };
            place.copy_from_slice(&chunk);
            at += chunk.len();
        }
        if at != dst.len() {
            return Err(self.short(offset, "a body shorter than its range"));
        }
        Ok(())
    }

    /// Reads each `(offset, destination)` piece, cut into requests of the configured size,
    /// all in flight together (the bucket's limit applies).
    fn get_all(&self, pieces: Vec<(u64, &mut [u8])>) -> Result<()> {
        let size = usize::try_from(self.bucket.config.request_bytes).unwrap_or(usize::MAX);
        let mut requests = Vec::new();
        for (offset, dst) in pieces {
            for (i, part) in dst.chunks_mut(size).enumerate() {
                requests.push((offset + (i * size) as u64, part));
            }
        }
        if requests.is_empty() {
            return Ok(());
        }
        let n = requests.len();
        self.bucket.io.block_on(
            &self.url,
            futures::stream::iter(requests)
                .map(|(offset, part)| self.get_into(offset, part))
                .buffer_unordered(n)
                .try_collect::<()>(),
        )?
    }

    fn error(&self, e: object_store::Error, offset: u64) -> fastensor_core::Error {
        from_store(e, &self.url, "read").with_offset(offset)
    }

    fn changed(&self, offset: u64) -> fastensor_core::Error {
        about(
            ErrorKind::Changed,
            "the object was replaced while it was read (its ETag changed)",
            &self.url,
        )
        .with_offset(offset)
    }

    fn short(&self, offset: u64, what: &str) -> fastensor_core::Error {
        about(ErrorKind::Io, format!("the server sent {what}"), &self.url).with_offset(offset)
    }

    /// `dst` clamped to the object's end, as host memory.
    fn host<'a>(&self, offset: u64, dst: MemMut<'a>) -> Result<&'a mut [u8]> {
        match dst {
            MemMut::Host(h) => {
                let n = readable_len(offset, h.len(), self.len);
                Ok(&mut h[..n])
            }
            MemMut::Device(d) => Err(unsupported_memory(
                crate::backend_of(&self.url),
                MemMut::Device(d).kind(),
                &self.url,
            )),
        }
    }
}

impl BackendFile for ObjectFile {
    fn path(&self) -> &Path {
        &self.url
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let dst = self.host(offset, dst)?;
        let n = dst.len();
        self.get_all(vec![(offset, dst)])?;
        Ok(n)
    }

    /// As many as the bucket lets go at once: each read is one GET (or a few).
    fn reads_in_flight(&self) -> Option<usize> {
        Some(self.bucket.config.concurrency)
    }

    /// Every request's GETs in flight together.
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        let mut pieces = Vec::with_capacity(requests.len());
        let mut counts = Vec::with_capacity(requests.len());
        for req in requests.iter_mut() {
            let dst = self.host(req.offset, req.dst.reborrow())?;
            counts.push(dst.len());
            pieces.push((req.offset, dst));
        }
        self.get_all(pieces)?;
        for (req, n) in requests.iter_mut().zip(counts) {
            req.done = n;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, _src: MemRef<'_>) -> Result<()> {
        Err(about(
            ErrorKind::Unsupported,
            "an object opened for reading cannot be written",
            &self.url,
        )
        .with_offset(offset))
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.len)
    }

    fn set_len(&self, _len: u64) -> Result<()> {
        Err(about(
            ErrorKind::Unsupported,
            "an object opened for reading cannot be resized",
            &self.url,
        ))
    }
}
