//! Tensors handed over from Python as raw memory: a `(name, dtype, shape, address, nbytes,
//! device)` tuple per tensor, built by `fastensor._memory` from a live torch tensor or numpy
//! array. The Python caller keeps every such object alive (and its memory unmoved) for the
//! whole call; `device` is -1 for host memory, else the CUDA ordinal.

use fastensor::core::{DeviceSlice, DeviceSliceMut};
use fastensor::{DType, Error, ErrorKind, MemMut, MemRef, Result, TensorDesc};

/// One tensor to save: `(name, dtype, shape, address, nbytes, device)`.
pub type SaveSpec = (String, String, Vec<u64>, usize, usize, i64);

/// One destination to fill: `(name, address, nbytes, device)`.
pub type TargetSpec = (String, usize, usize, i64);

/// The descriptor of a save spec, checked against its byte count.
pub fn desc_of(spec: &SaveSpec) -> Result<TensorDesc> {
    let (name, dtype, shape, _, nbytes, _) = spec;
    let dtype: DType = dtype.parse()?;
    let desc = TensorDesc::new(name.clone(), dtype, shape.clone());
    let want = desc.byte_len()?;
    if want != *nbytes as u64 {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("tensor `{name}`: {dtype} × {shape:?} is {want} bytes, its memory {nbytes}"),
        ));
    }
    Ok(desc)
}

fn ordinal(device: i64) -> Result<Option<u32>> {
    match device {
        -1 => Ok(None),
        d => u32::try_from(d).map(Some).map_err(|_| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("no such device ordinal {d}"),
            )
        }),
    }
}

/// The memory of a save spec.
///
/// # Safety
/// `addr..addr + nbytes` must be readable memory (host, or device memory of GPU `device`)
/// that stays valid and unmoved for `'a`; the Python wrapper holds the owning tensors.
pub unsafe fn mem_ref<'a>(addr: usize, nbytes: usize, device: i64) -> Result<MemRef<'a>> {
    if nbytes == 0 {
        return Ok(MemRef::Host(&[]));
    }
    Ok(match ordinal(device)? {
        // SAFETY: the caller's contract: host memory readable for `'a`.
        None => MemRef::Host(unsafe { std::slice::from_raw_parts(addr as *const u8, nbytes) }),
        // SAFETY: the caller's contract: device memory of GPU `o`, valid for `'a`.
        Some(o) => MemRef::Device(unsafe { DeviceSlice::from_raw(addr as u64, nbytes, o) }),
    })
}

/// The memory of a target spec.
///
/// # Safety
/// `addr..addr + nbytes` must be writable memory (host, or device memory of GPU `device`)
/// that stays valid and unmoved for `'a` and that nobody else reads or writes meanwhile;
/// distinct targets must not overlap.
pub unsafe fn mem_mut<'a>(addr: usize, nbytes: usize, device: i64) -> Result<MemMut<'a>> {
    if nbytes == 0 {
        return Ok(MemMut::Host(&mut []));
    }
    Ok(match ordinal(device)? {
        // SAFETY: the caller's contract: host memory writable and unshared for `'a`.
        None => MemMut::Host(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, nbytes) }),
        // SAFETY: the caller's contract: device memory of GPU `o`, unshared for `'a`.
        Some(o) => MemMut::Device(unsafe { DeviceSliceMut::from_raw(addr as u64, nbytes, o) }),
    })
}

/// Refuses destinations that overlap: `(device, address, nbytes, what)` each, where `what`
/// names the destination in the error. Empty destinations never overlap.
pub fn check_disjoint<'n>(
    spans: impl IntoIterator<Item = (i64, usize, usize, &'n str)>,
) -> Result<()> {
    let mut spans: Vec<(i64, usize, usize, &str)> = spans
        .into_iter()
        .filter(|s| s.2 > 0)
        .map(|(d, a, len, what)| (d, a, a + len, what))
        .collect();
    spans.sort_unstable();
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

/// The destinations of target specs, checked not to overlap ([`check_disjoint`]).
///
/// # Safety
/// Every spec must satisfy [`mem_mut`]'s contract for `'a`.
pub unsafe fn targets<'a>(specs: &'a [TargetSpec]) -> Result<Vec<(&'a str, MemMut<'a>)>> {
    check_disjoint(
        specs
            .iter()
            .map(|(n, a, len, d)| (*d, *a, *len, n.as_str())),
    )?;
    specs
        .iter()
        .map(|(name, addr, nbytes, device)| {
            // SAFETY: forwarded from this function's contract; the specs do not overlap.
            Ok((name.as_str(), unsafe { mem_mut(*addr, *nbytes, *device)? }))
        })
        .collect()
}
