//! The host side of the ABI: loading plugin libraries with `libloading`, and the backend and
//! file types that forward [`Backend`] and [`BackendFile`] calls to a plugin's table.

use crate::abi::{
    mode_code, EntryFn, ErrorCode, FfiCapabilities, PluginHeader, PluginV1, Status, ABI_VERSION,
    ENTRY_SYMBOL, STATUS_OK,
};
use fastensor_core::{
    Availability, Backend, BackendFile, Capabilities, Error, ErrorKind, MemMut, MemRef, OpenMode,
    Result,
};
use std::ffi::c_void;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A loaded plugin library. Dropping the last reference unloads it.
struct Library {
    path: PathBuf,
    table: PluginV1,
    // Declared last: the library is unloaded only after everything above is gone.
    _lib: libloading::Library,
}

/// One backend instance inside a plugin, freed with the plugin's `destroy`.
struct Instance {
    lib: Arc<Library>,
    ptr: *mut c_void,
    name: String,
}

// SAFETY: the ABI requires instances to be usable from any thread (the plugin side wraps a
// `Backend`, which is Send + Sync), and the pointer is only ever passed back to the plugin.
unsafe impl Send for Instance {}
// SAFETY: as for Send: the plugin functions taking `*const` instances may run concurrently.
unsafe impl Sync for Instance {}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: ptr was made by this library's `create` and is destroyed exactly once, here;
        // the library is still loaded (self.lib is dropped after this).
        unsafe { (self.lib.table.destroy)(self.ptr) }
    }
}

impl Instance {
    /// The error behind `status`, fetched from the plugin on this thread.
    fn error(&self, status: Status) -> Error {
        fetch_error(&self.lib.table, status).with_backend(&self.name)
    }
}

/// The error the plugin recorded for the call that returned `status` on this thread.
fn fetch_error(table: &PluginV1, status: Status) -> Error {
    let mut kind = 0i32;
    let mut os = 0i32;
    let mut buf = vec![0u8; 512];
    // SAFETY: every pointer is valid for the writes last_error makes (buf for buf.len()).
    let mut n = unsafe { (table.last_error)(&mut kind, &mut os, buf.as_mut_ptr(), buf.len()) };
    if n > buf.len() {
        buf.resize(n, 0);
        // SAFETY: as above, with the larger buffer.
        n = unsafe { (table.last_error)(&mut kind, &mut os, buf.as_mut_ptr(), buf.len()) };
        n = n.min(buf.len());
    }
    buf.truncate(n);
    let code = if kind != 0 { kind } else { status };
    let mut message = String::from_utf8_lossy(&buf).into_owned();
    if message.is_empty() {
        message = format!("the plugin failed with status {status} and no message");
    }
    let err = Error::new(ErrorCode::kind_of(code), message);
    if os != 0 {
        err.with_source(std::io::Error::from_raw_os_error(os))
    } else {
        err
    }
}

/// A backend served by a dynamic plugin. It keeps the plugin library loaded, as does every
/// file it opens.
#[derive(Clone)]
pub struct DynamicBackend {
    inst: Arc<Instance>,
    caps: Capabilities,
}

impl fmt::Debug for DynamicBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamicBackend")
            .field("name", &self.inst.name)
            .field("library", &self.inst.lib.path)
            .finish()
    }
}

/// An error and its sources, as one line: libloading keeps the `dlerror` text in the source.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cur = e.source();
    }
    text
}

fn load_error(kind: ErrorKind, path: &Path, message: impl Into<String>) -> Error {
    Error::new(kind, message).with_path(path)
}

impl DynamicBackend {
    /// Loads the plugin library at `path` and makes its backend.
    ///
    /// A missing file is [`ErrorKind::NotFound`]; a file that is not a shared library, or a
    /// library that does not export [`ENTRY_SYMBOL`], [`ErrorKind::InvalidInput`]; a plugin
    /// built for another ABI version, [`ErrorKind::Unsupported`]. Every error names the file.
    ///
    /// # Trust
    /// Loading a library runs its code (initialisers, then the plugin's functions) in this
    /// process: load only libraries you trust, built with `export_plugin!` of a
    /// `fastensor-plugin` that speaks the same [`ABI_VERSION`]. The version and the table's
    /// size are checked before anything else is read, but a library that lies about them, or
    /// whose functions break the ABI's rules, is undefined behaviour. A path without a `/` is
    /// searched for like `dlopen` does.
    pub fn load(path: impl AsRef<Path>) -> Result<DynamicBackend> {
        let path = path.as_ref();
        let lib = open_library(path)?;
        let table = function_table(&lib, path)?;
        let lib = Arc::new(Library {
            path: path.to_path_buf(),
            table,
            _lib: lib,
        });
        let inst = create_instance(lib, path)?;
        let caps = instance_capabilities(&inst, path)?;
        Ok(DynamicBackend {
            inst: Arc::new(inst),
            caps,
        })
    }

    /// The library this backend came from.
    pub fn library_path(&self) -> &Path {
        &self.inst.lib.path
    }
}

/// Loads the shared library at `path` (see [`DynamicBackend::load`]: missing,
/// [`ErrorKind::NotFound`]; not a library, [`ErrorKind::InvalidInput`]).
fn open_library(path: &Path) -> Result<libloading::Library> {
    let has_dir = path.components().count() > 1;
    if has_dir && !path.exists() {
        return Err(load_error(
            ErrorKind::NotFound,
            path,
            "cannot load plugin: no such file",
        ));
    }
    // SAFETY: loading runs the library's initialisers; the caller trusts this file (see
    // `# Trust`). Nothing else is assumed about it until `function_table` checks its header.
    unsafe { libloading::Library::new(path) }.map_err(|e| {
        let text = e.to_string();
        let kind = if !has_dir && text.contains("No such file") {
            ErrorKind::NotFound
        } else {
            ErrorKind::InvalidInput
        };
        load_error(
            kind,
            path,
            format!(
                "cannot load plugin: not a loadable shared library ({})",
                chain(&e)
            ),
        )
    })
}

/// The plugin's function table: its entry point called, the header's ABI version and the
/// table's size checked before the table is read.
fn function_table(lib: &libloading::Library, path: &Path) -> Result<PluginV1> {
    let symbol = format!("{ENTRY_SYMBOL}\0");
    // SAFETY: the symbol, when present, is the plugin entry point whose type the ABI fixes
    // as `EntryFn`; the copied fn pointer is used only while `lib` stays loaded.
    let entry: EntryFn = unsafe { lib.get::<EntryFn>(symbol.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| {
            load_error(
                ErrorKind::InvalidInput,
                path,
                format!(
                    "cannot load plugin: not a fastensor plugin (the library exports no \
                     `{ENTRY_SYMBOL}` symbol: {})",
                    chain(&e)
                ),
            )
        })?;
    // SAFETY: calling the entry point takes no arguments; it returns a pointer to a
    // table that lives as long as the library.
    let table_ptr = unsafe { entry() };
    if table_ptr.is_null() {
        return Err(load_error(
            ErrorKind::InvalidInput,
            path,
            format!("cannot load plugin: `{ENTRY_SYMBOL}` returned no table"),
        ));
    }
    // SAFETY: every ABI version starts its table with a PluginHeader, which is read alone
    // before anything else; the pointer is non-null and points into the loaded library.
    let header = unsafe { table_ptr.cast::<PluginHeader>().read_unaligned() };
    if header.abi_version != ABI_VERSION {
        return Err(load_error(
            ErrorKind::Unsupported,
            path,
            format!(
                "cannot load plugin: it was built for plugin ABI version {}, but this \
                 fastensor speaks version {ABI_VERSION}; rebuild it against fastensor-plugin {}",
                header.abi_version,
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    let want = std::mem::size_of::<PluginV1>();
    if (header.struct_size as usize) < want {
        return Err(load_error(
            ErrorKind::InvalidInput,
            path,
            format!(
                "cannot load plugin: its function table is {} bytes, version {ABI_VERSION} \
                 needs {want}",
                header.struct_size
            ),
        ));
    }
    // SAFETY: the header says this is a version-1 table of at least size_of::<PluginV1>()
    // bytes, so reading one PluginV1 (fn pointers and integers) is valid.
    Ok(unsafe { table_ptr.read_unaligned() })
}

/// Creates the plugin's backend instance and reads its name (never empty).
fn create_instance(lib: Arc<Library>, path: &Path) -> Result<Instance> {
    let table = lib.table;
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `create` is the plugin's, out points to a local pointer.
    let status = unsafe { (table.create)(&mut ptr) };
    if status != STATUS_OK || ptr.is_null() {
        let e = fetch_error(&table, status);
        return Err(load_error(
            e.kind(),
            path,
            format!(
                "cannot load plugin: creating its backend failed: {}",
                e.message()
            ),
        ));
    }
    let mut inst = Instance {
        lib,
        ptr,
        name: String::new(),
    };
    let mut name_ptr: *const u8 = std::ptr::null();
    let mut name_len = 0usize;
    // SAFETY: inst.ptr is a live instance; the outputs point to locals.
    let status = unsafe { (table.name)(inst.ptr, &mut name_ptr, &mut name_len) };
    if status != STATUS_OK {
        return Err(inst.error(status).with_path(path));
    }
    let name_bytes = if name_len == 0 || name_ptr.is_null() {
        &[][..]
    } else {
        // SAFETY: the plugin says name_ptr holds name_len bytes owned by the live instance;
        // they are copied at once.
        unsafe { std::slice::from_raw_parts(name_ptr, name_len) }
    };
    let name = String::from_utf8_lossy(name_bytes).into_owned();
    if name.is_empty() {
        return Err(load_error(
            ErrorKind::InvalidInput,
            path,
            "cannot load plugin: its backend has an empty name",
        ));
    }
    inst.name = name;
    Ok(inst)
}

/// What the instance declares; only host memory crosses the boundary.
fn instance_capabilities(inst: &Instance, path: &Path) -> Result<Capabilities> {
    let table = &inst.lib.table;
    let mut caps = FfiCapabilities::default();
    // SAFETY: inst.ptr is a live instance; out points to a local.
    let status = unsafe { (table.capabilities)(inst.ptr, &mut caps) };
    if status != STATUS_OK {
        return Err(inst.error(status).with_path(path));
    }
    let mut caps = Capabilities::from(&caps);
    // Only host memory crosses the boundary.
    caps.device_memory = false;
    Ok(caps)
}

impl Backend for DynamicBackend {
    fn name(&self) -> &str {
        &self.inst.name
    }

    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }

    fn probe(&self) -> Availability {
        // SAFETY: the instance is live while self holds it.
        let status = unsafe { (self.inst.lib.table.probe)(self.inst.ptr) };
        if status == STATUS_OK {
            Availability::Available
        } else {
            Availability::Unavailable {
                reason: fetch_error(&self.inst.lib.table, status)
                    .message()
                    .to_string(),
            }
        }
    }

    fn open(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        let bytes = path_bytes(path).map_err(|e| e.with_path(path))?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: the instance is live; bytes is valid for its length; out points to a local.
        let status = unsafe {
            (self.inst.lib.table.open)(
                self.inst.ptr,
                bytes.as_ptr(),
                bytes.len(),
                mode_code(mode),
                &mut ptr,
            )
        };
        if status != STATUS_OK || ptr.is_null() {
            return Err(self.inst.error(status).with_path(path));
        }
        Ok(Box::new(DynamicFile {
            inst: self.inst.clone(),
            ptr,
            path: path.to_path_buf(),
        }))
    }
}

#[cfg(unix)]
fn path_bytes(path: &Path) -> Result<&[u8]> {
    use std::os::unix::ffi::OsStrExt;
    Ok(path.as_os_str().as_bytes())
}

#[cfg(not(unix))]
fn path_bytes(path: &Path) -> Result<&[u8]> {
    path.to_str()
        .map(str::as_bytes)
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "a plugin path must be UTF-8"))
}

/// A file opened through a dynamic plugin; closes the plugin's handle when dropped.
struct DynamicFile {
    ptr: *mut c_void,
    path: PathBuf,
    // Dropped after the handle is closed: keeps the library loaded until then.
    inst: Arc<Instance>,
}

// SAFETY: the ABI requires file handles to be usable from any thread at once (the plugin side
// wraps a `BackendFile`, which is Send + Sync); the pointer is only passed back to the plugin.
unsafe impl Send for DynamicFile {}
// SAFETY: as for Send.
unsafe impl Sync for DynamicFile {}

impl Drop for DynamicFile {
    fn drop(&mut self) {
        // SAFETY: ptr was made by this library's `open`, is closed exactly once, here, and the
        // library stays loaded through self.inst until after this.
        unsafe { (self.inst.lib.table.close)(self.ptr) }
    }
}

impl DynamicFile {
    fn check(&self, status: Status, offset: Option<u64>) -> Result<()> {
        if status == STATUS_OK {
            return Ok(());
        }
        let err = self.inst.error(status).with_path(&self.path);
        Err(match offset {
            Some(o) => err.with_offset(o),
            None => err,
        })
    }
}

impl BackendFile for DynamicFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, offset: u64, dst: MemMut<'_>) -> Result<usize> {
        let buf = dst.host_for(&self.inst.name, &self.path)?;
        let mut read = 0usize;
        // SAFETY: the handle is live; buf is valid for writes of buf.len() bytes and borrowed
        // exclusively for the call; read points to a local.
        let status = unsafe {
            (self.inst.lib.table.read_at)(self.ptr, offset, buf.as_mut_ptr(), buf.len(), &mut read)
        };
        self.check(status, Some(offset))?;
        if read > buf.len() {
            return Err(Error::new(
                ErrorKind::Other,
                format!(
                    "the plugin claims to have read {read} bytes into a {}-byte buffer",
                    buf.len()
                ),
            )
            .with_backend(&self.inst.name)
            .with_path(&self.path)
            .with_offset(offset));
        }
        Ok(read)
    }

    fn write_at(&self, offset: u64, src: MemRef<'_>) -> Result<()> {
        let buf = src.host_for(&self.inst.name, &self.path)?;
        // SAFETY: the handle is live; buf is valid for reads of buf.len() bytes for the call.
        let status =
            unsafe { (self.inst.lib.table.write_at)(self.ptr, offset, buf.as_ptr(), buf.len()) };
        self.check(status, Some(offset))
    }

    fn sync(&self) -> Result<()> {
        // SAFETY: the handle is live.
        let status = unsafe { (self.inst.lib.table.sync)(self.ptr) };
        self.check(status, None)
    }

    fn len(&self) -> Result<u64> {
        let mut len = 0u64;
        // SAFETY: the handle is live; out points to a local.
        let status = unsafe { (self.inst.lib.table.len)(self.ptr, &mut len) };
        self.check(status, None)?;
        Ok(len)
    }

    fn set_len(&self, len: u64) -> Result<()> {
        // SAFETY: the handle is live.
        let status = unsafe { (self.inst.lib.table.set_len)(self.ptr, len) };
        self.check(status, None)
    }
}
