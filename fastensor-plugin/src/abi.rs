//! The ABI's types: the entry point, the function table of version 1, and the wire forms of
//! statuses, error kinds, open modes and capabilities. See the [crate documentation](crate)
//! for the rules every function follows.

use fastensor_core::{Capabilities, Error, ErrorKind, OpenMode};
use std::ffi::c_void;

/// The ABI version this build of fastensor speaks. A plugin with another version is refused
/// with [`ErrorKind::Unsupported`].
pub const ABI_VERSION: u32 = 1;

/// The name of the one symbol a plugin library exports (without the trailing NUL).
pub const ENTRY_SYMBOL: &str = "fastensor_plugin";

/// The type of the [`ENTRY_SYMBOL`] function.
pub type EntryFn = unsafe extern "C" fn() -> *const PluginV1;

/// The start of every plugin table, whatever its version: read first, to check the version
/// before trusting the rest of the layout.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PluginHeader {
    /// The ABI version the plugin was built for.
    pub abi_version: u32,
    /// `size_of` the plugin's table, in bytes.
    pub struct_size: u32,
}

/// A status returned by the plugin functions: `0` is success, anything else an error whose
/// details `last_error` gives.
pub type Status = i32;

/// Success.
pub const STATUS_OK: Status = 0;

/// Error kind codes on the wire: a stable number for each [`ErrorKind`].
///
/// Codes the host does not know map to [`ErrorKind::Other`].
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// [`ErrorKind::NotFound`].
    NotFound = 1,
    /// [`ErrorKind::PermissionDenied`].
    PermissionDenied = 2,
    /// [`ErrorKind::AlreadyExists`].
    AlreadyExists = 3,
    /// [`ErrorKind::Unavailable`]; also what `probe` returns for an unavailable backend.
    Unavailable = 4,
    /// [`ErrorKind::Unsupported`].
    Unsupported = 5,
    /// [`ErrorKind::InvalidInput`].
    InvalidInput = 6,
    /// [`ErrorKind::Unaligned`].
    Unaligned = 7,
    /// [`ErrorKind::Corrupt`].
    Corrupt = 8,
    /// [`ErrorKind::UnexpectedEof`].
    UnexpectedEof = 9,
    /// [`ErrorKind::StorageFull`].
    StorageFull = 10,
    /// [`ErrorKind::OutOfMemory`].
    OutOfMemory = 11,
    /// [`ErrorKind::Device`].
    Device = 12,
    /// [`ErrorKind::Io`].
    Io = 13,
    /// [`ErrorKind::Other`], and panics caught in the plugin.
    Other = 14,
    /// [`ErrorKind::Changed`].
    Changed = 15,
}

impl ErrorCode {
    /// The code of an error kind. `ErrorKind` is `#[non_exhaustive]`: a kind added to
    /// `fastensor-core` without a code here crosses the boundary as [`ErrorCode::Other`]
    /// (give it a new code, keeping the old ones, when adding it).
    pub fn from_kind(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::NotFound => ErrorCode::NotFound,
            ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
            ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
            ErrorKind::Unavailable => ErrorCode::Unavailable,
            ErrorKind::Unsupported => ErrorCode::Unsupported,
            ErrorKind::InvalidInput => ErrorCode::InvalidInput,
            ErrorKind::Unaligned => ErrorCode::Unaligned,
            ErrorKind::Corrupt => ErrorCode::Corrupt,
            ErrorKind::UnexpectedEof => ErrorCode::UnexpectedEof,
            ErrorKind::StorageFull => ErrorCode::StorageFull,
            ErrorKind::OutOfMemory => ErrorCode::OutOfMemory,
            ErrorKind::Device => ErrorCode::Device,
            ErrorKind::Io => ErrorCode::Io,
            ErrorKind::Other => ErrorCode::Other,
            ErrorKind::Changed => ErrorCode::Changed,
            _ => ErrorCode::Other,
        }
    }

    /// The error kind of a code received from a plugin; unknown codes are
    /// [`ErrorKind::Other`].
    pub fn kind_of(code: i32) -> ErrorKind {
        match code {
            1 => ErrorKind::NotFound,
            2 => ErrorKind::PermissionDenied,
            3 => ErrorKind::AlreadyExists,
            4 => ErrorKind::Unavailable,
            5 => ErrorKind::Unsupported,
            6 => ErrorKind::InvalidInput,
            7 => ErrorKind::Unaligned,
            8 => ErrorKind::Corrupt,
            9 => ErrorKind::UnexpectedEof,
            10 => ErrorKind::StorageFull,
            11 => ErrorKind::OutOfMemory,
            12 => ErrorKind::Device,
            13 => ErrorKind::Io,
            15 => ErrorKind::Changed,
            _ => ErrorKind::Other,
        }
    }

    /// The status value of this code.
    pub fn status(self) -> Status {
        self as i32
    }
}

/// [`OpenMode`] on the wire.
pub mod open_mode {
    /// [`OpenMode::Read`](fastensor_core::OpenMode::Read).
    pub const READ: u32 = 0;
    /// [`OpenMode::ReadWrite`](fastensor_core::OpenMode::ReadWrite).
    pub const READ_WRITE: u32 = 1;
    /// [`OpenMode::Create`](fastensor_core::OpenMode::Create).
    pub const CREATE: u32 = 2;
    /// [`OpenMode::Truncate`](fastensor_core::OpenMode::Truncate).
    pub const TRUNCATE: u32 = 3;
}

/// The wire code of an open mode.
pub fn mode_code(mode: OpenMode) -> u32 {
    match mode {
        OpenMode::Read => open_mode::READ,
        OpenMode::ReadWrite => open_mode::READ_WRITE,
        OpenMode::Create => open_mode::CREATE,
        OpenMode::Truncate => open_mode::TRUNCATE,
    }
}

/// The open mode of a wire code, or an error for an unknown code.
pub fn mode_of_code(code: u32) -> Result<OpenMode, Error> {
    match code {
        open_mode::READ => Ok(OpenMode::Read),
        open_mode::READ_WRITE => Ok(OpenMode::ReadWrite),
        open_mode::CREATE => Ok(OpenMode::Create),
        open_mode::TRUNCATE => Ok(OpenMode::Truncate),
        other => Err(Error::new(
            ErrorKind::InvalidInput,
            format!("unknown open mode code {other}"),
        )),
    }
}

/// [`Capabilities`] on the wire. Flags are bytes (`0` false, anything else true) so that no
/// invalid `bool` can cross the boundary. [`Capabilities::maps_file`] does not cross (false
/// for a plugin).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FfiCapabilities {
    /// [`Capabilities::read`].
    pub read: u8,
    /// [`Capabilities::write`].
    pub write: u8,
    /// [`Capabilities::host_memory`].
    pub host_memory: u8,
    /// [`Capabilities::device_memory`] (the host ignores it: only host memory crosses).
    pub device_memory: u8,
    /// [`Capabilities::native_batch`].
    pub native_batch: u8,
    /// [`Capabilities::durable_sync`].
    pub durable_sync: u8,
    /// [`Capabilities::bypasses_page_cache`].
    pub bypasses_page_cache: u8,
    /// [`Capabilities::local_files`] (zero from plugins built before it was named: their
    /// loads are read, never mapped).
    pub local_files: u8,
    /// [`Capabilities::memory_alignment`].
    pub memory_alignment: u64,
    /// [`Capabilities::offset_alignment`].
    pub offset_alignment: u64,
    /// [`Capabilities::queue_depth`].
    pub queue_depth: u32,
    /// Padding, zero.
    pub reserved2: u32,
}

impl From<&Capabilities> for FfiCapabilities {
    fn from(c: &Capabilities) -> Self {
        FfiCapabilities {
            read: c.read.into(),
            write: c.write.into(),
            host_memory: c.host_memory.into(),
            device_memory: c.device_memory.into(),
            native_batch: c.native_batch.into(),
            durable_sync: c.durable_sync.into(),
            bypasses_page_cache: c.bypasses_page_cache.into(),
            local_files: c.local_files.into(),
            memory_alignment: c.memory_alignment,
            offset_alignment: c.offset_alignment,
            queue_depth: c.queue_depth,
            reserved2: 0,
        }
    }
}

impl From<&FfiCapabilities> for Capabilities {
    fn from(c: &FfiCapabilities) -> Self {
        Capabilities {
            read: c.read != 0,
            write: c.write != 0,
            host_memory: c.host_memory != 0,
            device_memory: c.device_memory != 0,
            native_batch: c.native_batch != 0,
            durable_sync: c.durable_sync != 0,
            bypasses_page_cache: c.bypasses_page_cache != 0,
            local_files: c.local_files != 0,
            maps_file: false,
            memory_alignment: c.memory_alignment.max(1),
            offset_alignment: c.offset_alignment.max(1),
            queue_depth: c.queue_depth.max(1),
        }
    }
}

/// The function table of ABI version 1, returned by the [`ENTRY_SYMBOL`] function.
///
/// Pointers named `backend` are instances made by `create`; pointers named `file` are handles
/// made by `open`. See the [crate documentation](crate) for the rules every function follows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PluginV1 {
    /// [`ABI_VERSION`] when the plugin was built; first, never moves.
    pub abi_version: u32,
    /// `size_of::<PluginV1>()` when the plugin was built; second, never moves.
    pub struct_size: u32,
    /// Makes a backend instance and stores it in `*out`.
    pub create: unsafe extern "C" fn(out: *mut *mut c_void) -> Status,
    /// Frees a backend instance. Handles it opened stay valid.
    pub destroy: unsafe extern "C" fn(backend: *mut c_void),
    /// Stores the backend's name (UTF-8, not NUL-terminated, owned by the instance and valid
    /// while it lives) in `*ptr` and `*len`.
    pub name: unsafe extern "C" fn(
        backend: *const c_void,
        ptr: *mut *const u8,
        len: *mut usize,
    ) -> Status,
    /// `0` when the backend can run here; otherwise a code (usually
    /// [`ErrorCode::Unavailable`]) and the reason in `last_error`.
    pub probe: unsafe extern "C" fn(backend: *const c_void) -> Status,
    /// Stores the backend's capabilities in `*out`.
    pub capabilities:
        unsafe extern "C" fn(backend: *const c_void, out: *mut FfiCapabilities) -> Status,
    /// Opens the file whose path is the `path_len` bytes at `path` (the OS string's bytes on
    /// Unix, UTF-8 elsewhere) in the [mode](open_mode) `mode`, storing the handle in `*out`.
    pub open: unsafe extern "C" fn(
        backend: *const c_void,
        path: *const u8,
        path_len: usize,
        mode: u32,
        out: *mut *mut c_void,
    ) -> Status,
    /// Reads up to `len` bytes at `offset` into `dst`, storing the count in `*read` (short
    /// only at the end of the file).
    pub read_at: unsafe extern "C" fn(
        file: *const c_void,
        offset: u64,
        dst: *mut u8,
        len: usize,
        read: *mut usize,
    ) -> Status,
    /// Writes all `len` bytes at `src` to `offset`.
    pub write_at: unsafe extern "C" fn(
        file: *const c_void,
        offset: u64,
        src: *const u8,
        len: usize,
    ) -> Status,
    /// Makes completed writes durable.
    pub sync: unsafe extern "C" fn(file: *const c_void) -> Status,
    /// Stores the file's length in `*out`.
    pub len: unsafe extern "C" fn(file: *const c_void, out: *mut u64) -> Status,
    /// Cuts or extends the file to `len` bytes.
    pub set_len: unsafe extern "C" fn(file: *const c_void, len: u64) -> Status,
    /// Frees a file handle.
    pub close: unsafe extern "C" fn(file: *mut c_void),
    /// Describes the last failed call on this thread: stores its [`ErrorCode`] in `*kind`
    /// (`0` when none), its OS error code in `*os_error` (`0` when none), copies up to `cap`
    /// bytes of its UTF-8 message to `buf`, and returns the message's full length (call again
    /// with a larger buffer when it exceeds `cap`).
    pub last_error:
        unsafe extern "C" fn(kind: *mut i32, os_error: *mut i32, buf: *mut u8, cap: usize) -> usize,
}

impl PluginV1 {
    /// The header every table starts with.
    pub fn header(&self) -> PluginHeader {
        PluginHeader {
            abi_version: self.abi_version,
            struct_size: self.struct_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_round_trip_every_kind() {
        for kind in [
            ErrorKind::NotFound,
            ErrorKind::PermissionDenied,
            ErrorKind::AlreadyExists,
            ErrorKind::Unavailable,
            ErrorKind::Unsupported,
            ErrorKind::InvalidInput,
            ErrorKind::Unaligned,
            ErrorKind::Corrupt,
            ErrorKind::UnexpectedEof,
            ErrorKind::StorageFull,
            ErrorKind::OutOfMemory,
            ErrorKind::Device,
            ErrorKind::Io,
            ErrorKind::Other,
        ] {
            let code = ErrorCode::from_kind(kind).status();
            assert_ne!(code, STATUS_OK);
            assert_eq!(ErrorCode::kind_of(code), kind);
        }
        assert_eq!(ErrorCode::kind_of(999), ErrorKind::Other);
    }

    #[test]
    fn modes_and_capabilities_round_trip() {
        for mode in [
            OpenMode::Read,
            OpenMode::ReadWrite,
            OpenMode::Create,
            OpenMode::Truncate,
        ] {
            assert_eq!(mode_of_code(mode_code(mode)).unwrap(), mode);
        }
        assert_eq!(mode_of_code(7).unwrap_err().kind(), ErrorKind::InvalidInput);
        let caps = Capabilities {
            native_batch: true,
            queue_depth: 8,
            memory_alignment: 4096,
            ..Capabilities::default()
        };
        assert_eq!(Capabilities::from(&FfiCapabilities::from(&caps)), caps);
    }

    #[test]
    fn header_is_the_start_of_the_table() {
        assert_eq!(std::mem::offset_of!(PluginV1, abi_version), 0);
        assert_eq!(std::mem::offset_of!(PluginV1, struct_size), 4);
        assert_eq!(std::mem::size_of::<PluginHeader>(), 8);
    }
}
