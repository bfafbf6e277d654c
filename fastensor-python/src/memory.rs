//! Memory lent by Python objects for one call.
//!
//! Python never passes an address. It passes the object that owns the memory: a torch
//! tensor, a numpy array or anything else that exports DLPack (`__dlpack__`), or an object
//! with the buffer protocol (`bytes`, `bytearray`, `memoryview`, `mmap`, arrays). [`lend`]
//! takes the address, length and device from the object's own export, checks that the
//! memory is contiguous (and writable when it is to be written), and returns a [`Lent`]
//! that holds the export (and so the object) until it is dropped, after the transfer.
//! Every range a call touches is checked against the lent length ([`Lent::range`]).
//!
//! Who owns what: the Python object owns its memory throughout; a [`Lent`] only keeps it
//! alive and unmoved while Rust reads or writes it, with the GIL released. Writes go only
//! to objects lent with [`Access::Write`], which refuses read-only exports (a read-only
//! numpy array or `memoryview`, `bytes`, a DLPack capsule flagged read-only) and host
//! memory that is not mapped writable (a read-only `np.memmap`, or a tensor made from one).
//! A torch tensor's export is never flagged read-only (torch has no such notion): one over
//! a read-only buffer in writable memory is written. Memory lent with [`Access::Read`] is
//! asked for read-only (see [`export_dlpack`]).

mod writable;

use crate::dlpack::{
    DlManagedTensor, DlManagedTensorVersioned, DlTensor, DLTENSOR, DLTENSOR_VERSIONED,
    FLAG_READ_ONLY, KDL_CPU, KDL_CUDA, KDL_CUDA_HOST,
};
use fastensor::core::{DeviceSlice, DeviceSliceMut};
use fastensor::{Error, ErrorKind, MemMut, MemRef, Result};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::collections::HashMap;
use std::os::raw::c_int;

/// How a call uses lent memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    /// Only read (a save).
    Read,
    /// Written (a load into it).
    Write,
}

/// Where lent memory lives (host memory orders first).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Place {
    /// Host memory (also CUDA pinned host memory).
    Host,
    /// Device memory of the CUDA device with this ordinal.
    Cuda(u32),
}

/// A lent object's memory: its address, length and place (plain data, `Send`).
#[derive(Clone, Copy, Debug)]
pub struct Region {
    addr: usize,
    len: usize,
    place: Place,
}

/// Defines the [`Region`] method `$name`, the region as memory of type `$mem`: `$mem::Host`
/// over the slice `std::slice::$slice` makes of a `$ptr`, `$mem::Device` over a `$device`,
/// `$mem::Host($empty)` when the region is empty. The views to read and to write differ only
/// in these types; the method's `# Safety` says when the view is sound.
macro_rules! view {
    (
        $(#[$doc:meta])*
        $name:ident -> $mem:ident($empty:expr), $slice:ident($ptr:ty), $device:ident
    ) => {
        $(#[$doc])*
        pub unsafe fn $name<'a>(&self) -> $mem<'a> {
            if self.len == 0 {
                return $mem::Host($empty);
            }
            match self.place {
                // SAFETY: the caller's contract (the method's `# Safety`): host memory valid
                // for `'a`, used there only as that contract allows.
                Place::Host => $mem::Host(unsafe {
                    std::slice::$slice(self.addr as $ptr, self.len)
                }),
                Place::Cuda(o) => {
                    // SAFETY: the caller's contract: device memory of GPU `o`, valid for `'a`,
                    // used there only as that contract allows.
                    let slice = unsafe { $device::from_raw(self.addr as u64, self.len, o) };
                    $mem::Device(slice)
                }
            }
        }
    };
}

impl Region {
    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Where the memory lives.
    pub fn place(&self) -> Place {
        self.place
    }

    /// The memory's address (for bookkeeping only; never dereferenced from it).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// `len` bytes from `offset`, refused when they do not lie within the region. `what`
    /// names the destination or tensor in the error.
    pub fn range(&self, offset: usize, len: usize, what: &str) -> Result<Region> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(Region {
                addr: self.addr + offset,
                len,
                place: self.place,
            }),
            _ => Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{what}: {len} bytes at offset {offset} do not fit in its memory of {} bytes",
                    self.len
                ),
            )),
        }
    }

    view! {
        /// The region as memory to read.
        ///
        /// # Safety
        /// The region must come from a [`Lent`] (or [`Region::range`] of one) that is alive for
        /// `'a`, and nothing may write the memory meanwhile.
        as_ref -> MemRef(&[]), from_raw_parts(*const u8), DeviceSlice
    }

    view! {
        /// The region as memory to write.
        ///
        /// # Safety
        /// The region must come from a [`Lent`] lent with [`Access::Write`] that is alive for
        /// `'a`; nobody else may read or write it meanwhile, and regions used together must not
        /// overlap ([`check_disjoint`]).
        as_mut -> MemMut(&mut []), from_raw_parts_mut(*mut u8), DeviceSliceMut
    }
}

/// What keeps a lent object's memory valid: the object and its export.
enum Export {
    /// A DLPack capsule not consumed: dropping it runs the producer's deleter.
    DlPack { _capsule: Py<PyAny> },
    /// A buffer-protocol view, released on drop.
    Buffer(Box<ffi::Py_buffer>),
}

/// An object's memory, lent for one call: valid and unmoved until this is dropped (the
/// export holds a reference to the object).
pub struct Lent {
    region: Region,
    export: Export,
}

impl Lent {
    /// The lent memory.
    pub fn region(&self) -> Region {
        self.region
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Export::Buffer(view) = &mut self.export {
            Python::attach(|_| {
                // SAFETY: the view was filled by a successful `PyObject_GetBuffer` and is
                // released once, here, with the GIL held.
                unsafe { ffi::PyBuffer_Release(&mut **view) }
            });
        }
    }
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidInput, msg)
}

/// The byte length of a DLPack tensor whose memory is one contiguous, row-major block.
///
/// # Safety
/// `t` must be a live `DLTensor` from a capsule that is still held (its `shape` and
/// `strides` arrays valid for `ndim` entries).
unsafe fn dl_contiguous_len(t: &DlTensor, what: &str) -> Result<usize> {
    let ndim = usize::try_from(t.ndim).map_err(|_| invalid(format!("{what}: bad DLPack ndim")))?;
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else if t.shape.is_null() {
        return Err(invalid(format!("{what}: DLPack export without a shape")));
    } else {
        // SAFETY: the caller's contract: `shape` holds `ndim` entries.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let mut numel: u64 = 1;
    for &d in shape {
        let d = u64::try_from(d).map_err(|_| invalid(format!("{what}: negative dimension")))?;
        numel = numel
            .checked_mul(d)
            .ok_or_else(|| invalid(format!("{what}: its size overflows")))?;
    }
    let bits = u64::from(t.dtype.bits) * u64::from(t.dtype.lanes);
    if bits == 0 {
        return Err(invalid(format!("{what}: a DLPack dtype of zero bits")));
    }
    if numel > 0 && !t.strides.is_null() && ndim > 0 {
        // SAFETY: the caller's contract: `strides` holds `ndim` entries when not null.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expected: i64 = 1;
        for (&d, &s) in shape.iter().zip(strides).rev() {
            if d != 1 && s != expected {
                return Err(invalid(format!(
                    "{what}: not contiguous (shape {shape:?}, strides {strides:?}); make it \
                     contiguous first"
                )));
            }
            expected = expected.saturating_mul(d);
        }
    }
    let bytes = numel
        .checked_mul(bits)
        .map(|b| b.div_ceil(8))
        .ok_or_else(|| invalid(format!("{what}: its size overflows")))?;
    usize::try_from(bytes).map_err(|_| invalid(format!("{what}: too large for this machine")))
}

/// The region of a DLPack tensor.
///
/// # Safety
/// As [`dl_contiguous_len`].
unsafe fn dl_region(t: &DlTensor, what: &str) -> Result<Region> {
    // SAFETY: forwarded.
    let len = unsafe { dl_contiguous_len(t, what)? };
    let place = match t.device.device_type {
        KDL_CPU | KDL_CUDA_HOST => Place::Host,
        KDL_CUDA => Place::Cuda(
            u32::try_from(t.device.device_id)
                .map_err(|_| invalid(format!("{what}: bad CUDA device id")))?,
        ),
        other => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{what}: memory of DLPack device type {other} (only CPU and CUDA)"),
            ))
        }
    };
    let base = t.data as usize;
    let offset =
        usize::try_from(t.byte_offset).map_err(|_| invalid(format!("{what}: bad offset")))?;
    let addr = base
        .checked_add(offset)
        .ok_or_else(|| invalid(format!("{what}: bad address")))?;
    if len > 0 && base == 0 {
        return Err(invalid(format!("{what}: DLPack export without data")));
    }
    if addr.checked_add(len).is_none() || len > isize::MAX as usize {
        return Err(invalid(format!("{what}: its memory wraps around")));
    }
    Ok(Region { addr, len, place })
}

fn py_to_err(e: PyErr, what: &str) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("{what}: its memory cannot be lent: {e}"),
    )
}

/// The DLPack capsule of `obj`, in the newest form its producer knows:
/// `__dlpack__(max_version=(1, 0))` (the versioned protocol, which can say "read-only"), and
/// for memory only read also `read_only=True` (torch then exports a copy-on-write tensor
/// as it is, where a writable export would first copy it); a keyword the producer refuses
/// with a `TypeError` is dropped and the call made again (`read_only`, then
/// `max_version`).
fn export_dlpack<'py>(
    obj: &Bound<'py, PyAny>,
    access: Access,
    what: &str,
    stream: Option<usize>,
) -> Result<Bound<'py, PyAny>> {
    let py = obj.py();
    let err = |e: PyErr| py_to_err(e, what);
    let kwargs = PyDict::new(py);
    if let Some(stream) = stream {
        // DLPack's stream handshake: the producer orders its pending work on the memory
        // before whatever is queued on `stream` from now on.
        kwargs.set_item("stream", stream).map_err(err)?;
    }
    kwargs
        .set_item("max_version", PyTuple::new(py, [1u32, 0u32]).map_err(err)?)
        .map_err(err)?;
    if access == Access::Read {
        kwargs.set_item("read_only", true).map_err(err)?;
    }
    let dlpack = obj.getattr("__dlpack__").map_err(err)?;
    loop {
        match dlpack.call((), Some(&kwargs)) {
            Ok(c) => return Ok(c),
            Err(e) if e.is_instance_of::<PyTypeError>(py) && !kwargs.is_empty() => {
                let newest = if kwargs.contains("read_only").map_err(err)? {
                    "read_only"
                } else if kwargs.contains("max_version").map_err(err)? {
                    "max_version"
                } else {
                    "stream"
                };
                kwargs.del_item(newest).map_err(err)?;
            }
            Err(e) if e.is_instance_of::<PyBufferError>(py) => {
                return Err(invalid(format!("{what}: {e}")))
            }
            Err(e) => return Err(err(e)),
        }
    }
}

/// Lends `obj` through DLPack (see [`export_dlpack`]). Dropping the [`Lent`] needs no GIL
/// (the capsule's reference is released by pyo3, deferred if need be).
pub fn lend_dlpack(obj: &Bound<'_, PyAny>, access: Access, what: &str) -> Result<Lent> {
    lend_dlpack_on(obj, access, what, None)
}

/// As [`lend_dlpack`], with DLPack's stream handshake for device memory: `stream` is the
/// handle of the stream that will use the memory (the producer orders its pending work on
/// it first).
pub fn lend_dlpack_on(
    obj: &Bound<'_, PyAny>,
    access: Access,
    what: &str,
    stream: Option<usize>,
) -> Result<Lent> {
    let capsule = export_dlpack(obj, access, what, stream)?;
    let cap = capsule.as_ptr();
    // SAFETY: `cap` is a live object; `PyCapsule_IsValid` only reads it.
    let (region, read_only) = unsafe {
        if ffi::PyCapsule_IsValid(cap, DLTENSOR_VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, DLTENSOR_VERSIONED.as_ptr())
                .cast::<DlManagedTensorVersioned>();
            if m.is_null() || (*m).version.major != 1 {
                return Err(invalid(format!("{what}: an unknown DLPack version")));
            }
            (
                dl_region(&(*m).dl_tensor, what)?,
                (*m).flags & FLAG_READ_ONLY != 0,
            )
        } else if ffi::PyCapsule_IsValid(cap, DLTENSOR.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, DLTENSOR.as_ptr()).cast::<DlManagedTensor>();
            if m.is_null() {
                return Err(invalid(format!("{what}: an empty DLPack capsule")));
            }
            (dl_region(&(*m).dl_tensor, what)?, false)
        } else {
            ffi::PyErr_Clear();
            return Err(invalid(format!(
                "{what}: `__dlpack__` did not return a DLPack capsule"
            )));
        }
    };
    if access == Access::Write && read_only {
        return Err(invalid(format!("{what}: its memory is read-only")));
    }
    Ok(Lent {
        region,
        export: Export::DlPack {
            _capsule: capsule.unbind(),
        },
    })
}

/// Lends `obj` through the buffer protocol (contiguous, writable when written).
fn lend_buffer(obj: &Bound<'_, PyAny>, access: Access, what: &str) -> Result<Lent> {
    let mut view: Box<ffi::Py_buffer> = Box::new(ffi::Py_buffer::new());
    let flags: c_int = match access {
        Access::Read => ffi::PyBUF_C_CONTIGUOUS,
        Access::Write => ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_WRITABLE,
    };
    // SAFETY: `obj` is a live object and `view` points to writable `Py_buffer` storage.
    let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
    if rc != 0 {
        let e = PyErr::fetch(obj.py());
        let why = if access == Access::Write {
            "a contiguous, writable buffer is needed"
        } else {
            "a contiguous buffer is needed"
        };
        return Err(invalid(format!("{what}: {why}: {e}")));
    }
    let len = usize::try_from(view.len).unwrap_or(0);
    let region = Region {
        addr: view.buf as usize,
        len,
        place: Place::Host,
    };
    Ok(Lent {
        region,
        export: Export::Buffer(view),
    })
}

/// Lends the memory of `obj` for one call (see the module's doc). `what` names it in errors.
pub fn lend(obj: &Bound<'_, PyAny>, access: Access, what: &str) -> Result<Lent> {
    if obj.hasattr("__dlpack__").unwrap_or(false) {
        return lend_dlpack(obj, access, what);
    }
    // SAFETY: `obj` is a live object; the check only reads its type.
    if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 0 {
        let type_name = obj.get_type().name().map(|n| n.to_string());
        return Err(invalid(format!(
            "{what}: an object of type {} has no memory to lend (expected a tensor, an array \
             or a buffer)",
            type_name.as_deref().unwrap_or("?")
        )));
    }
    lend_buffer(obj, access, what)
}

/// The objects of one call, each lent once however many ranges of it the call uses.
pub struct Lender {
    access: Access,
    lent: Vec<Lent>,
    by_object: HashMap<usize, usize>,
}

impl Lender {
    /// An empty lender for memory used with `access`.
    pub fn new(access: Access) -> Lender {
        Lender {
            access,
            lent: Vec::new(),
            by_object: HashMap::new(),
        }
    }

    /// The region of `obj` (lent now, or earlier in this call).
    pub fn region(&mut self, obj: &Bound<'_, PyAny>, what: &str) -> Result<Region> {
        let key = obj.as_ptr() as usize;
        if let Some(&i) = self.by_object.get(&key) {
            return Ok(self.lent[i].region());
        }
        let lent = lend(obj, self.access, what)?;
        let region = lent.region();
        self.by_object.insert(key, self.lent.len());
        self.lent.push(lent);
        Ok(region)
    }

    /// Refuses host memory to be written that is not mapped writable (a read-only mapping
    /// would make the write a segmentation fault).
    pub fn check_writable(&self) -> Result<()> {
        if self.access != Access::Write {
            return Ok(());
        }
        let host: Vec<Region> = self
            .lent
            .iter()
            .map(Lent::region)
            .filter(|r| r.place == Place::Host && r.len > 0)
            .collect();
        writable::check(&host)
    }
}

/// Refuses destinations that overlap: `(region, what)` each. Empty ones never overlap.
pub fn check_disjoint<'n>(spans: impl IntoIterator<Item = (Region, &'n str)>) -> Result<()> {
    let mut spans: Vec<(Place, usize, usize, &str)> = spans
        .into_iter()
        .filter(|(r, _)| r.len > 0)
        .map(|(r, what)| (r.place, r.addr, r.addr + r.len, what))
        .collect();
    spans.sort_unstable_by_key(|s| (s.0, s.1));
    for w in spans.windows(2) {
        if w[0].0 == w[1].0 && w[1].1 < w[0].2 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "`{}` and `{}` share memory: both cannot be read into",
                    w[0].3, w[1].3
                ),
            ));
        }
    }
    Ok(())
}
