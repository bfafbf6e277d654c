//! The conformance suite: every backend passes it.
//!
//! Which checks run follows the backend's [`Capabilities`]: a read-only backend gets its test
//! files written by the standard library and is checked on reads; a backend that takes device
//! memory is also run over the [`TestMemory`] a device crate provides. A backend whose probe
//! says it is unavailable is **skipped and printed**, never silently passed; set
//! `FASTENSOR_REQUIRE=name,...` to make a missing backend a failure.
//!
//! Test files go to a fresh directory under `FASTENSOR_TEST_DIR` (default: the system
//! temporary directory), removed afterwards.

use crate::test_memory::{HostMemory, TestMemory};
use fastensor_core::{Availability, Backend, BackendFile, Capabilities, MemoryKind, OpenMode};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

mod checks;

/// The outcome of one check: `Err` carries what went wrong.
pub type CheckResult = Result<(), String>;

/// What a check runs.
pub type CheckFn = fn(&Harness<'_>) -> CheckResult;

/// One named check of the suite.
#[derive(Clone, Copy)]
pub struct Check {
    /// A short name, e.g. `"round_trip_sizes"`.
    pub name: &'static str,
    /// True when the check needs the backend to write.
    pub needs_write: bool,
    /// Runs the check.
    pub run: fn(&Harness<'_>) -> CheckResult,
}

impl fmt::Debug for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Check").field("name", &self.name).finish()
    }
}

/// Every check of the suite, in the order they run.
pub fn checks() -> Vec<Check> {
    let table: [(&'static str, bool, CheckFn); 14] = [
        ("round_trip_sizes", false, checks::round_trip_sizes),
        (
            "unaligned_offsets_and_buffers",
            false,
            checks::unaligned_offsets_and_buffers,
        ),
        (
            "overwrite_keeps_neighbours",
            true,
            checks::overwrite_keeps_neighbours,
        ),
        (
            "read_past_end_is_short",
            false,
            checks::read_past_end_is_short,
        ),
        (
            "file_changed_through_another_handle",
            true,
            checks::file_changed_through_another_handle,
        ),
        (
            "batch_of_small_requests",
            false,
            checks::batch_of_small_requests,
        ),
        (
            "threads_share_one_handle",
            false,
            checks::threads_share_one_handle,
        ),
        (
            "missing_file_is_not_found",
            false,
            checks::missing_file_is_not_found,
        ),
        ("directory_is_refused", false, checks::directory_is_refused),
        (
            "read_only_handle_refuses_writes",
            true,
            checks::read_only_handle_refuses_writes,
        ),
        (
            "zero_length_transfers",
            false,
            checks::zero_length_transfers,
        ),
        (
            "write_past_end_sets_exact_length",
            true,
            checks::write_past_end_sets_exact_length,
        ),
        (
            "set_len_cuts_and_extends",
            true,
            checks::set_len_cuts_and_extends,
        ),
        (
            "proptest_offsets_lengths_alignment",
            false,
            checks::proptest_offsets_lengths_alignment,
        ),
    ];
    table
        .into_iter()
        .map(|(name, needs_write, run)| Check {
            name,
            needs_write,
            run,
        })
        .collect()
}

/// The state one run of the suite shares among its checks.
pub struct Harness<'a> {
    backend: &'a dyn Backend,
    caps: Capabilities,
    memory: &'a dyn TestMemory,
    dir: tempfile::TempDir,
    counter: AtomicU64,
}

impl fmt::Debug for Harness<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness")
            .field("backend", &self.backend.name())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl<'a> Harness<'a> {
    /// A harness for `backend` over `memory`, with a fresh test directory.
    pub fn new(backend: &'a dyn Backend, memory: &'a dyn TestMemory) -> std::io::Result<Self> {
        let base = std::env::var_os("FASTENSOR_TEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = tempfile::Builder::new()
            .prefix("fastensor-conformance-")
            .tempdir_in(base)?;
        Ok(Harness {
            backend,
            caps: backend.capabilities(),
            memory,
            dir,
            counter: AtomicU64::new(0),
        })
    }

    /// The backend under test.
    pub fn backend(&self) -> &dyn Backend {
        self.backend
    }

    /// A fresh path in the test directory.
    pub fn path(&self, tag: &str) -> PathBuf {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        self.dir.path().join(format!("{tag}-{n}.bin"))
    }

    /// Opens `path` with the backend, turning an error into a message.
    pub fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>, String> {
        self.backend
            .open(path, mode)
            .map_err(|e| format!("open {mode:?} failed: {e}"))
    }

    /// Creates `path` holding `content`: through the backend when it writes, else with the
    /// standard library.
    pub fn create(&self, path: &Path, content: &[u8]) -> CheckResult {
        if self.caps.write {
            let f = self.open(path, OpenMode::Truncate)?;
            self.write(f.as_ref(), 0, content, 0)?;
            f.sync().map_err(|e| format!("sync failed: {e}"))
        } else {
            std::fs::write(path, content).map_err(|e| format!("std::fs::write failed: {e}"))
        }
    }

    /// Writes `data` at `offset` from a test buffer `misalign` bytes past a page boundary.
    pub fn write(
        &self,
        file: &dyn BackendFile,
        offset: u64,
        data: &[u8],
        misalign: usize,
    ) -> CheckResult {
        let mut buf = self.memory.alloc(data.len(), misalign);
        buf.upload(data);
        file.write_at(offset, buf.as_mem()).map_err(|e| {
            format!(
                "write_at({offset}, {} bytes, misalign {misalign}) failed: {e}",
                data.len()
            )
        })
    }

    /// Writes `data` at `offset` of `path`: through the backend when it writes, else with
    /// the standard library.
    pub fn put(&self, path: &Path, offset: u64, data: &[u8], misalign: usize) -> CheckResult {
        if self.caps.write {
            let f = self.open(path, OpenMode::Create)?;
            self.write(f.as_ref(), offset, data, misalign)?;
            f.sync().map_err(|e| format!("sync failed: {e}"))
        } else {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| e.to_string())?;
            f.write_all_at(data, offset).map_err(|e| e.to_string())
        }
    }

    /// Reads `len` bytes at `offset` into a test buffer `misalign` bytes past a page
    /// boundary; returns the bytes read (short at end of file).
    pub fn read(
        &self,
        file: &dyn BackendFile,
        offset: u64,
        len: usize,
        misalign: usize,
    ) -> Result<Vec<u8>, String> {
        let mut buf = self.memory.alloc(len, misalign);
        let n = file.read_at(offset, buf.as_mem_mut()).map_err(|e| {
            format!("read_at({offset}, {len} bytes, misalign {misalign}) failed: {e}")
        })?;
        if n > len {
            return Err(format!(
                "read_at returned {n} bytes for a {len}-byte buffer"
            ));
        }
        let mut out = buf.download();
        out.truncate(n);
        Ok(out)
    }

    /// Reads the whole of `path` through a new handle of the backend.
    pub fn read_whole(&self, path: &Path) -> Result<Vec<u8>, String> {
        let f = self.open(path, OpenMode::Read)?;
        let len = f.len().map_err(|e| format!("len failed: {e}"))? as usize;
        let got = self.read(f.as_ref(), 0, len, 0)?;
        if got.len() != len {
            return Err(format!(
                "read {} of {len} bytes of the whole file",
                got.len()
            ));
        }
        Ok(got)
    }
}

/// What one run of the suite found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The backend's name.
    pub backend: String,
    /// The memory kinds the suite ran over.
    pub memory: Vec<MemoryKind>,
    /// Set when the backend was skipped as unavailable: the reason.
    pub skipped: Option<String>,
    /// True when the skip counts as a failure (`FASTENSOR_REQUIRE` names the backend).
    pub required: bool,
    /// Checks that passed (`name [memory]`).
    pub passed: Vec<String>,
    /// Checks that failed, with what went wrong.
    pub failed: Vec<(String, String)>,
}

impl Report {
    /// True when nothing failed and no required backend was skipped.
    pub fn ok(&self) -> bool {
        self.failed.is_empty() && !(self.skipped.is_some() && self.required)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(reason) = &self.skipped {
            let req = if self.required {
                " but FASTENSOR_REQUIRE requires it"
            } else {
                ""
            };
            return write!(
                f,
                "conformance of `{}`: SKIPPED, unavailable{req}: {reason}",
                self.backend
            );
        }
        writeln!(
            f,
            "conformance of `{}`: {} passed, {} failed",
            self.backend,
            self.passed.len(),
            self.failed.len()
        )?;
        for (name, why) in &self.failed {
            writeln!(f, "  FAILED {name}: {why}")?;
        }
        Ok(())
    }
}

/// True when `FASTENSOR_REQUIRE` (comma-separated names, or `all`) names `backend`.
pub fn required(backend: &str) -> bool {
    std::env::var("FASTENSOR_REQUIRE").is_ok_and(|v| {
        v.split(',')
            .map(str::trim)
            .any(|n| n == backend || n == "all")
    })
}

/// Runs every applicable check over host memory.
pub fn run(backend: &dyn Backend) -> Report {
    run_with_memory(backend, &[&HostMemory])
}

/// Runs every applicable check over each of `memories` the backend accepts.
pub fn run_with_memory(backend: &dyn Backend, memories: &[&dyn TestMemory]) -> Report {
    let mut report = Report {
        backend: backend.name().to_string(),
        ..Report::default()
    };
    if let Availability::Unavailable { reason } = backend.probe() {
        report.required = required(backend.name());
        report.skipped = Some(reason);
        eprintln!("{report}");
        return report;
    }
    let caps = backend.capabilities();
    for &memory in memories {
        if !caps.supports_memory(memory.kind()) {
            continue;
        }
        report.memory.push(memory.kind());
        let harness = match Harness::new(backend, memory) {
            Ok(h) => h,
            Err(e) => {
                report.failed.push((
                    "setup".into(),
                    format!("cannot create the test directory: {e}"),
                ));
                continue;
            }
        };
        for check in checks() {
            if check.needs_write && !caps.write {
                eprintln!(
                    "conformance of `{}`: {} not applicable (read-only backend)",
                    backend.name(),
                    check.name
                );
                continue;
            }
            let label = format!("{} [{}]", check.name, memory.kind());
            match catch_unwind(AssertUnwindSafe(|| (check.run)(&harness))) {
                Ok(Ok(())) => report.passed.push(label),
                Ok(Err(why)) => report.failed.push((label, why)),
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "unknown panic".into());
                    report.failed.push((label, format!("panicked: {msg}")));
                }
            }
        }
    }
    eprintln!("{report}");
    report
}

/// Runs the suite over host memory and panics with the failures, if any.
pub fn assert_conformance(backend: &dyn Backend) -> Report {
    assert_report(run(backend))
}

/// Runs the suite over `memories` and panics with the failures, if any.
pub fn assert_conformance_with_memory(
    backend: &dyn Backend,
    memories: &[&dyn TestMemory],
) -> Report {
    assert_report(run_with_memory(backend, memories))
}

fn assert_report(report: Report) -> Report {
    assert!(report.ok(), "{report}");
    report
}
