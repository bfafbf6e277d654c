//! The safetensors format as the Rust side defines it, for the Python package: the dtype
//! table, the layout of a file in memory, the header parser, and how sizes written by
//! people are read. Python keeps no copy of any of them.

use crate::engine::{save_tensors, views, SaveSpec};
use crate::errors::IntoPy;
use crate::memory::{Access, Lender};
use fastensor::DType;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::BTreeMap;
use std::path::Path;

/// What the messages name instead of a file.
const WHERE: &str = "<bytes>";

/// Every dtype of the format as `(name, bits per element)`, in the format's order (the
/// order that lays tensors out in memory, widest last).
#[pyfunction]
fn dtypes() -> Vec<(&'static str, usize)> {
    DType::ALL.iter().map(|d| (d.name(), d.bits())).collect()
}

/// The bytes of a safetensors file holding the tensors of `specs` (`(name, dtype, shape,
/// object)`, each object's memory in host memory holding exactly the tensor's bytes) and
/// `metadata` (written whenever given, even empty), laid out byte for byte as the
/// `safetensors` package lays them out (`fastensor::checkpoint::serialize`).
#[pyfunction]
#[pyo3(signature = (specs, metadata=None))]
fn serialize<'py>(
    py: Python<'py>,
    specs: Vec<SaveSpec<'py>>,
    metadata: Option<BTreeMap<String, String>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut lender = Lender::new(Access::Read);
    let named = |e: fastensor::Error| e.with_path(Path::new(WHERE));
    let tensors = save_tensors(&specs, &mut lender).map_err(named).py_err()?;
    // SAFETY: `lender` keeps every tensor's memory lent (read-only) until this returns.
    let views = unsafe { views(&tensors) };
    let layout = fastensor::checkpoint::serialized(&views, metadata.as_ref())
        .map_err(named)
        .py_err()?;
    // The copy holds the interpreter: the lent objects stay as they are meanwhile.
    PyBytes::new_with(py, layout.len(), |out| {
        layout.write_into(out).map_err(named).py_err()
    })
}

/// One tensor of a parsed header: `(name, dtype, shape, start, end)`, its bytes at
/// `start..end` of the data section.
type HeaderRow = (String, &'static str, Vec<u64>, u64, u64);

/// A parsed header: the data section's offset, the tensors, the `__metadata__` map (empty
/// when the header has none).
type ParsedHeader = (u64, Vec<HeaderRow>, BTreeMap<String, String>);

/// Parses and validates the header of the safetensors file held in `data` (bytes or any
/// object with the buffer protocol; only its header is read): returns the offset of the data
/// section, the tensors in data order and the `__metadata__` map; a defect is a
/// `CorruptError`.
#[pyfunction]
fn parse_header(data: &Bound<'_, PyAny>) -> PyResult<ParsedHeader> {
    let mut lender = Lender::new(Access::Read);
    let region = lender.region(data, "the bytes").py_err()?;
    // SAFETY: `lender` keeps the buffer lent (read-only) until this returns.
    let bytes: &[u8] = match unsafe { region.as_ref() } {
        fastensor::MemRef::Host(b) => b,
        fastensor::MemRef::Device(_) => {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "expected bytes in host memory",
            ))
        }
    };
    let header = fastensor::checkpoint::parse_header(bytes, bytes.len() as u64)
        .map_err(|e| e.with_path(Path::new(WHERE)))
        .py_err()?;
    let start = header.data_start();
    let (entries, metadata) = header.into_parts();
    let rows = entries
        .into_iter()
        .map(|e| {
            let dtype = e.desc.dtype.name();
            (
                e.desc.name,
                dtype,
                e.desc.shape,
                e.offsets.start,
                e.offsets.end,
            )
        })
        .collect();
    Ok((start, rows, metadata))
}

/// The bytes `text` names, as every size of fastensor is read
/// (`fastensor::core::size::parse_size`: `4K`, `512MiB` powers of 1024; `5GB` powers of
/// 1000, as Hugging Face reads `max_shard_size`). A text that names no size is a
/// `ValueError`.
#[pyfunction]
fn parse_size(text: &str) -> PyResult<u64> {
    fastensor::core::size::parse_size(text).map_err(pyo3::exceptions::PyValueError::new_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(serialize, m)?)?;
    m.add_function(wrap_pyfunction!(parse_header, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    Ok(())
}
