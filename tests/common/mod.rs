//! Test support shared by the checkpoint tests: tensors as views and as destinations to
//! fill, and a backend wrapper that counts and limits what goes through it. Each test crate
//! uses a part of it.
#![allow(dead_code)]

use fastensor::checkpoint::TensorView;
use fastensor::core::{LayeredBackend, LayeredFile, ReadRequest, WriteRequest};
use fastensor::{
    Backend, BackendFile, Error, ErrorKind, MemMut, MemRef, OpenMode, Result, TensorDesc,
};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Tensors with their bytes, as the tests build them.
pub type Tensors = [(TensorDesc, Vec<u8>)];

/// Views of `s`, ready to save.
pub fn views(s: &Tensors) -> Vec<TensorView<'_>> {
    s.iter()
        .map(|(d, b)| TensorView::new(d.clone(), b))
        .collect()
}

/// One buffer per tensor of `s`, of its length, every byte `fill`.
pub fn buffers(s: &Tensors, fill: u8) -> Vec<Vec<u8>> {
    s.iter().map(|(_, b)| vec![fill; b.len()]).collect()
}

/// The targets of a load into `bufs` (see [`buffers`]): each tensor's name and buffer.
pub fn targets<'a>(s: &'a Tensors, bufs: &'a mut [Vec<u8>]) -> Vec<(&'a str, MemMut<'a>)> {
    s.iter()
        .zip(bufs.iter_mut())
        .map(|((d, _), b)| (d.name.as_str(), MemMut::Host(&mut b[..])))
        .collect()
}

/// What a [`Hooked`] backend counts and limits; every field is optional.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Bytes read through it.
    pub read: Option<Arc<AtomicU64>>,
    /// Bytes it still writes; a write past them fails with [`ErrorKind::StorageFull`]
    /// (like a full disk).
    pub budget: Option<Arc<AtomicU64>>,
    /// Batch calls made through it, and the requests they carried.
    pub batches: Option<(Arc<AtomicU64>, Arc<AtomicU64>)>,
}

/// A backend whose files report to [`Hooks`]: reads, writes and batches go to `inner`.
pub struct Hooked {
    pub inner: Arc<dyn Backend>,
    pub hooks: Hooks,
}

struct HookedFile {
    inner: Box<dyn BackendFile>,
    hooks: Hooks,
}

impl LayeredBackend for Hooked {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
    /// The inner backend's name: the engine sees the backend it wraps.
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn wrap(
        &self,
        inner: Box<dyn BackendFile>,
        _: &Path,
        _: OpenMode,
    ) -> Result<Box<dyn BackendFile>> {
        Ok(Box::new(HookedFile {
            inner,
            hooks: self.hooks.clone(),
        }))
    }
}

impl HookedFile {
    /// Counts one batch of `n` requests.
    fn batch(&self, n: usize) {
        if let Some((batches, batched)) = &self.hooks.batches {
            batches.fetch_add(1, Ordering::Relaxed);
            batched.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

impl LayeredFile for HookedFile {
    fn inner(&self) -> &dyn BackendFile {
        &*self.inner
    }
    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let n = self.inner.read_at(offset, dst)?;
        if let Some(c) = &self.hooks.read {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        if let Some(b) = &self.hooks.budget {
            let len = src.len() as u64;
            let spend = |left: u64| left.checked_sub(len);
            if b.fetch_update(Ordering::Relaxed, Ordering::Relaxed, spend)
                .is_err()
            {
                return Err(Error::new(ErrorKind::StorageFull, "no space left (test)"));
            }
        }
        self.inner.write_at(offset, src)
    }
    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<()> {
        self.batch(requests.len());
        if self.hooks.read.is_none() {
            return self.inner.read_batch(requests);
        }
        for req in requests.iter_mut() {
            req.done = LayeredFile::read_at(self, req.offset, req.dst.reborrow())?;
        }
        Ok(())
    }
    fn write_batch(&self, requests: &[WriteRequest<'_>]) -> Result<()> {
        self.batch(requests.len());
        if self.hooks.budget.is_none() {
            return self.inner.write_batch(requests);
        }
        requests
            .iter()
            .try_for_each(|req| LayeredFile::write_at(self, req.offset, req.src))
    }
}
