//! One bucket's client, shared by the files opened in it, and the I/O threads every
//! request of a process runs on.

use crate::config::ObjectConfig;
use crate::error::about;
use fastensor_core::{ErrorKind, Result};
use object_store::multipart::MultipartStore;
use object_store::ObjectStore;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// A client of one cloud's object store: reads, writes, and uploads in parts.
pub(crate) trait Store: ObjectStore + MultipartStore {}

impl<T: ObjectStore + MultipartStore> Store for T {}

/// One bucket's client and the limit on its requests in flight.
#[derive(Debug)]
pub(crate) struct Bucket {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) in_flight: Arc<Semaphore>,
    pub(crate) io: Arc<IoThreads>,
    pub(crate) config: ObjectConfig,
}

/// The I/O threads (a tokio runtime) of the process that made them.
///
/// Contract: [`block_on`](Self::block_on) runs a future to completion from any thread of
/// that process, also from inside another tokio runtime (an async caller: the future is
/// then driven from a thread of its own, as tokio refuses to block a runtime's thread on
/// another runtime); in a `fork()` child, where the threads do not exist, it is
/// [`ErrorKind::Unsupported`] at once, never a wait. Dropped in a child, the threads are
/// forgotten rather than waited for; dropped inside a runtime, they are shut down without
/// waiting.
#[derive(Debug)]
pub(crate) struct IoThreads {
    pid: u32,
    runtime: Option<Runtime>,
}

impl IoThreads {
    /// New I/O threads for this process.
    pub(crate) fn new() -> Result<Self> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("fastensor-s3")
            .enable_all()
            .build()
            .map_err(|e| {
                fastensor_core::Error::new(
                    ErrorKind::Io,
                    format!("cannot start the object-storage I/O threads: {e}"),
                )
            })?;
        Ok(IoThreads {
            pid: std::process::id(),
            runtime: Some(runtime),
        })
    }

    /// The runtime, in the process that made it; [`ErrorKind::Unsupported`] naming `url` in
    /// a `fork()` child.
    fn runtime(&self, url: &Path) -> Result<&Runtime> {
        match &self.runtime {
            Some(rt) if self.pid == std::process::id() => Ok(rt),
            _ => Err(about(
                ErrorKind::Unsupported,
                "opened before fork(): this process (the child) cannot use the parent's \
                 object-storage I/O threads; open the object again in this process",
                url,
            )),
        }
    }

    /// Runs `fut` to completion (see the type's contract); `url` names the object in errors.
    pub(crate) fn block_on<F>(&self, url: &Path, fut: F) -> Result<F::Output>
    where
        F: Future + Send,
        F::Output: Send,
    {
        let rt = self.runtime(url)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Ok(rt.block_on(fut));
        }
        // Inside a runtime: drive the future from a thread that is in none.
        Ok(std::thread::scope(|s| {
            match s.spawn(|| rt.block_on(fut)).join() {
                Ok(out) => out,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }))
    }

    /// Starts `fut` on the I/O threads.
    pub(crate) fn spawn<F>(&self, url: &Path, fut: F) -> Result<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        Ok(self.runtime(url)?.spawn(fut))
    }
}

impl Drop for IoThreads {
    fn drop(&mut self) {
        let Some(rt) = self.runtime.take() else {
            return;
        };
        if self.pid != std::process::id() {
            // A fork() child: the threads are the parent's; waiting for them would hang.
            std::mem::forget(rt);
        } else if tokio::runtime::Handle::try_current().is_ok() {
            // Inside a runtime, where tokio refuses to block.
            rt.shutdown_background();
        }
    }
}
