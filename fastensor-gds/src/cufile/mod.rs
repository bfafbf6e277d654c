//! cuFile (GPUDirect Storage): the library loaded once per process with `libloading`, the
//! driver opened once, `Result`-returning wrappers over the raw calls, and the RAII
//! [`FileHandle`]. Layering: [`ffi`] (raw) -> this module (results, RAII) -> the `gds` backend.

pub mod ffi;

use crate::cuda;
use crate::probe;
use fastensor_core::{Error, ErrorKind, Result};
use ffi::{CUfileDescr_t, CUfileDrvProps_t, CUfileError_t, CUfileHandleUnion, CuFileFns};
use std::ffi::c_void;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How cuFile moves the bytes on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GdsMode {
    /// True GPUDirect Storage: DMA between the storage and GPU memory.
    Direct {
        /// How: `nvidia-fs X.Y` or `PCI P2PDMA`.
        via: String,
    },
    /// Compatibility mode: cuFile reads and writes through host memory with POSIX I/O.
    Compatibility {
        /// Why true GDS is not in use.
        why: String,
    },
}

impl std::fmt::Display for GdsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GdsMode::Direct { via } => write!(f, "true GDS ({via})"),
            GdsMode::Compatibility { why } => write!(f, "compatibility mode ({why})"),
        }
    }
}

/// The open cuFile driver of this process.
#[derive(Debug)]
pub struct CuFile {
    fns: CuFileFns,
    path: String,
    props: CUfileDrvProps_t,
    mode: GdsMode,
    _lib: libloading::Library,
}

static CUFILE: OnceLock<std::result::Result<CuFile, String>> = OnceLock::new();

/// The cuFile driver, loaded and opened on first use (from `explicit`, else
/// `FASTENSOR_CUFILE`, else the search in [`probe`]). The library and the driver stay for the
/// whole process; the first caller's path wins. The error says precisely why GDS cannot run.
pub fn cufile(explicit: Option<&Path>) -> std::result::Result<&'static CuFile, String> {
    CUFILE
        .get_or_init(
            || match std::panic::catch_unwind(|| open(explicit.map(Path::to_path_buf))) {
                Ok(r) => r,
                Err(p) => Err(format!(
                    "cuFile panicked while loading: {}",
                    cuda::panic_message(&p)
                )),
            },
        )
        .as_ref()
        .map_err(Clone::clone)
}

/// The driver when it is already open; never loads it.
fn opened() -> Option<&'static CuFile> {
    CUFILE.get().and_then(|r| r.as_ref().ok())
}

fn open(explicit: Option<PathBuf>) -> std::result::Result<CuFile, String> {
    let driver = cuda::driver()?;
    driver.bind(0).map_err(|e| e.to_string())?;
    let (candidates, origin) = probe::cufile_candidates(explicit.as_deref());
    let (lib, path) = probe::load_first("libcufile.so.0", &candidates, origin.as_deref())?;
    let fns = CuFileFns::load(&lib).map_err(|e| format!("{path} lacks a cuFile function: {e}"))?;
    // SAFETY: a CUDA context is current (bound above); cuFileDriverOpen takes no arguments.
    check(unsafe { (fns.driver_open)() })
        .map_err(|e| format!("cuFileDriverOpen failed ({path}): {e}"))?;
    let mut props = CUfileDrvProps_t::default();
    // SAFETY: props is a writable CUfileDrvProps_t with spare room at its end.
    check(unsafe { (fns.driver_get_properties)(&mut props) })
        .map_err(|e| format!("cuFileDriverGetProperties failed: {e}"))?;
    let mode = mode_of(&props);
    Ok(CuFile {
        fns,
        path,
        props,
        mode,
        _lib: lib,
    })
}

/// True GDS or compatibility mode, from the driver properties: cuFile moves data directly
/// when the nvidia-fs kernel module is loaded (its version is non-zero) or the kernel's
/// P2PDMA path is supported, unless POSIX I/O is forced.
fn mode_of(props: &CUfileDrvProps_t) -> GdsMode {
    let nvfs = props.nvfs;
    if nvfs.dcontrolflags & ffi::CONTROL_POSIX_IO != 0 {
        return GdsMode::Compatibility {
            why: "POSIX I/O forced by the cuFile configuration".into(),
        };
    }
    if nvfs.major_version > 0 && nvfs.dstatusflags & ffi::STATUS_NVME != 0 {
        return GdsMode::Direct {
            via: format!("nvidia-fs {}.{}", nvfs.major_version, nvfs.minor_version),
        };
    }
    if nvfs.dstatusflags & ffi::STATUS_NVME_P2P != 0 {
        return GdsMode::Direct {
            via: "PCI P2PDMA".into(),
        };
    }
    GdsMode::Compatibility {
        why: if nvfs.major_version == 0 {
            "the nvidia-fs kernel module is not loaded".into()
        } else {
            format!(
                "nvidia-fs {}.{} reports no NVMe support",
                nvfs.major_version, nvfs.minor_version
            )
        },
    }
}

/// `Err` with the error's name unless `e` is success.
fn check(e: CUfileError_t) -> std::result::Result<(), String> {
    if e.err == 0 {
        return Ok(());
    }
    if e.err == 5011 {
        return Err(format!(
            "{} (CUresult {})",
            ffi::op_error_name(e.err),
            e.cu_err
        ));
    }
    Err(format!("{} ({})", ffi::op_error_name(e.err), e.err))
}

impl CuFile {
    /// The library file loaded.
    pub fn library(&self) -> &str {
        &self.path
    }

    /// True GDS or compatibility mode.
    pub fn mode(&self) -> &GdsMode {
        &self.mode
    }

    /// The largest single transfer the driver issues directly, in bytes (16 MiB when the
    /// driver reports none).
    pub fn max_direct_io(&self) -> usize {
        match self.props.nvfs.max_direct_io_size {
            0 => 16 << 20,
            kib => kib.saturating_mul(1024).clamp(64 << 10, 1 << 30),
        }
    }

    /// The largest batch, when the library has the batch API.
    pub fn max_batch(&self) -> Option<usize> {
        self.fns.batch.map(|_| match self.props.max_batch_io_size {
            0 => 128,
            n => n as usize,
        })
    }

    pub(crate) fn fns(&self) -> &CuFileFns {
        &self.fns
    }

    /// Registers device memory `base..base + len` (the whole allocation) for faster I/O.
    pub(crate) fn register_buffer(&self, base: u64, len: usize) -> std::result::Result<(), String> {
        // SAFETY: base..base+len is a live cuMemAlloc allocation (from the allocation table)
        // and its context is current (the caller bound it).
        check(unsafe { (self.fns.buf_register)(base as *const c_void, len, 0) })
    }

    /// Registers `file` (opened with `O_DIRECT`) with cuFile.
    pub fn register(&'static self, file: &File, path: &Path) -> Result<FileHandle> {
        let mut descr = CUfileDescr_t {
            type_: ffi::HANDLE_TYPE_OPAQUE_FD,
            handle: CUfileHandleUnion {
                fd: file.as_raw_fd(),
            },
            fs_ops: std::ptr::null(),
        };
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: descr names an open descriptor that outlives the handle (FileHandle is
        // dropped before the File in the backend's file struct); handle is writable.
        let res = unsafe { (self.fns.handle_register)(&mut handle, &mut descr) };
        check(res).map_err(|e| {
            let kind = match res.err {
                5018 | 5019 | 5020 | 5008 => ErrorKind::Unsupported,
                _ => ErrorKind::Device,
            };
            Error::new(kind, format!("cuFileHandleRegister failed: {e}")).with_path(path)
        })?;
        Ok(FileHandle {
            raw: handle,
            cufile: self,
        })
    }
}

/// Deregisters the buffer at `base` if cuFile is open (called when a DeviceBuffer is freed,
/// with its context current).
pub(crate) fn deregister_buffer(base: u64) {
    if let Some(cf) = opened() {
        // SAFETY: base was registered with cuFileBufRegister and is still allocated.
        let _ = unsafe { (cf.fns.buf_deregister)(base as *const c_void) };
    }
}

/// A file registered with cuFile; deregistered on drop.
#[derive(Debug)]
pub struct FileHandle {
    raw: *mut c_void,
    cufile: &'static CuFile,
}

// SAFETY: cuFile handles may be used from several threads at once (cuFile is thread-safe for
// I/O on one handle); the handle is only deregistered on drop.
unsafe impl Send for FileHandle {}
// SAFETY: as above.
unsafe impl Sync for FileHandle {}

/// Defines the [`FileHandle`] method `$name`, one synchronous cuFile transfer: the call of
/// [`CuFileFns`] of the same name (cuFileRead or cuFileWrite) on `size` bytes between the
/// device address `base + buf_offset` (passed as `$ptr`) and `file_offset`, its result mapped
/// by [`io_result`]. The two calls differ only in the direction of the bytes, and so in the
/// pointer type of their buffer.
macro_rules! transfer {
    ($(#[$doc:meta])* $name:ident as $ptr:ty) => {
        $(#[$doc])*
        pub unsafe fn $name(
            &self,
            base: u64,
            size: usize,
            file_offset: u64,
            buf_offset: u64,
        ) -> std::io::Result<usize> {
            let (file_offset, buf_offset) = (to_off(file_offset)?, to_off(buf_offset)?);
            // SAFETY: the caller guarantees the buffer (the method's `# Safety`); the handle is
            // registered.
            let n = unsafe {
                (self.cufile.fns.$name)(self.raw, base as $ptr, size, file_offset, buf_offset)
            };
            io_result(n)
        }
    };
}

impl FileHandle {
    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw
    }

    transfer! {
        /// Reads `size` bytes at `file_offset` into device memory `base + buf_offset`; returns
        /// the bytes read (short only at the end of the file).
        ///
        /// # Safety
        /// `base + buf_offset .. + size` must be writable device memory of the current context,
        /// not accessed by anyone else during the call.
        read as *mut c_void
    }

    transfer! {
        /// Writes `size` bytes from device memory `base + buf_offset` at `file_offset`; returns
        /// the bytes written.
        ///
        /// # Safety
        /// `base + buf_offset .. + size` must be readable device memory of the current context,
        /// not written by anyone else during the call.
        write as *const c_void
    }
}

fn to_off(x: u64) -> std::io::Result<i64> {
    i64::try_from(x).map_err(|_| std::io::Error::from_raw_os_error(22))
}

/// A `CUfileOpError` (5000 and above) returned by cuFileRead or cuFileWrite: a failure of
/// cuFile or of the CUDA driver below it, not of the operating system. It is carried as the
/// inner error of the `std::io::Error` that [`FileHandle::read`] and [`FileHandle::write`]
/// return; [`OpError::of`] finds it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpError {
    /// The `CUfileOpError` value.
    pub code: i32,
}

impl OpError {
    /// The cuFile error inside `e`, if it holds one.
    pub fn of(e: &std::io::Error) -> Option<OpError> {
        e.get_ref()?.downcast_ref::<OpError>().copied()
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", ffi::op_error_name(self.code), self.code)
    }
}

impl std::error::Error for OpError {}

/// cuFileRead/Write results: bytes, -1 with `errno`, or a negated `CUfileOpError`.
fn io_result(n: isize) -> std::io::Result<usize> {
    if n >= 0 {
        return Ok(n as usize);
    }
    if n == -1 {
        return Err(std::io::Error::last_os_error());
    }
    let code = i32::try_from(-n).unwrap_or(i32::MAX);
    if code < 5000 {
        return Err(std::io::Error::from_raw_os_error(code));
    }
    Err(std::io::Error::other(OpError { code }))
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        // SAFETY: raw was returned by cuFileHandleRegister and is deregistered once.
        unsafe { (self.cufile.fns.handle_deregister)(self.raw) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_follows_the_driver_properties() {
        let mut p = CUfileDrvProps_t::default();
        assert!(matches!(mode_of(&p), GdsMode::Compatibility { .. }));
        p.nvfs.major_version = 2;
        p.nvfs.minor_version = 17;
        p.nvfs.dstatusflags = ffi::STATUS_NVME;
        assert_eq!(mode_of(&p).to_string(), "true GDS (nvidia-fs 2.17)");
        p.nvfs.dcontrolflags = ffi::CONTROL_POSIX_IO;
        assert!(mode_of(&p).to_string().starts_with("compatibility mode"));
    }

    #[test]
    fn io_results_map_to_os_errors() {
        assert_eq!(io_result(42).unwrap(), 42);
        assert_eq!(io_result(-5).unwrap_err().raw_os_error(), Some(5));
        let e = io_result(-5024).unwrap_err();
        assert_eq!(OpError::of(&e), Some(OpError { code: 5024 }));
        assert!(
            e.to_string().contains("CU_FILE_MEMORY_NOT_REGISTERED"),
            "{e}"
        );
        assert_eq!(OpError::of(&io_result(-5).unwrap_err()), None);
    }

    #[test]
    fn cufile_without_cuda_is_an_error_not_a_panic() {
        if cuda::driver().is_ok() {
            return; // a GPU machine: covered by the conformance tests
        }
        let err = cufile(None).unwrap_err();
        assert!(!err.is_empty());
    }
}
