"""Safetensors in memory, for the framework-free API and the torch and numpy front ends.

The format is Rust's (``fastensor::checkpoint``): :func:`serialize` hands the tensors to the
native layout (byte for byte the one ``safetensors`` writes) and :func:`parse` validates
hostile bytes with the engine's header parser before anything is allocated (raising
:class:`~fastensor.errors.CorruptError`). The dtype table comes from the native module too;
this module only checks what Python callers pass and shapes the results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from . import _native
from ._common import PathLike, check_metadata, fspath
from ._engine import Engine, engine_or_default
from .errors import WrongTypeError, _invalid

#: Bits per element of every dtype name the format knows (the native table).
BITS: dict[str, int] = dict(_native.dtypes())

#: What the messages name instead of a file.
WHERE = "<bytes>"


class Entry(NamedTuple):
    """One tensor of a parsed buffer: its bytes are ``data[start:end]``."""

    name: str
    dtype: str
    shape: list[int]
    start: int
    end: int


def _uint(value: object) -> bool:
    return type(value) is int and value >= 0


def parse(data: bytes | bytearray | memoryview) -> tuple[memoryview, list[Entry], dict | None]:
    """Validates the safetensors buffer ``data`` with the engine's own header parser (the
    one every file load goes through): returns the view of its data section, its tensors in
    data order (safetensors gives them in no fixed order), and its ``__metadata__``
    (``None`` when absent).

    Raises:
        TypeError: ``data`` is not a bytes-like object.
        ValueError (CorruptError): anything the format does not allow, named.
    """
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"expected bytes, got {type(data).__name__}") from None
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    start, rows, metadata = _native.parse_header(view)
    entries = [Entry(name, dtype, list(shape), s, e) for name, dtype, shape, s, e in rows]
    return view[start:], entries, (metadata or None)


# The framework-free API of the ``safetensors`` module itself.

#: Framework dtype names (``str(torch.float32)``'s tail, ``numpy.dtype.name``) -> safetensors'.
_FRAMEWORK_NAMES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "int64": "I64",
    "uint64": "U64",
    "float64": "F64",
    "complex64": "C64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float4_e2m1fn_x2": "F4",
}


class TensorSpec:
    """One tensor for :func:`serialize` and :func:`serialize_file`, as
    ``safetensors.TensorSpec`` describes one: ``dtype`` (a safetensors name such as
    ``"F32"``, or a framework's such as ``"float32"``; checked now), ``shape`` and ``data``,
    an object holding the tensor's bytes (``bytes``, a buffer, a contiguous array).

    For ``dtype="float4_e2m1fn_x2"`` (torch's packed F4), ``shape`` is torch's and the last
    dimension is doubled to the logical shape the header records (as safetensors does).
    Unlike safetensors, the memory is given as an object, never as an address:
    ``data_ptr``/``data_len`` are refused.

    Raises:
        SafetensorError (InvalidInputError): an unknown dtype.
        TypeError (WrongTypeError): ``data_ptr`` or ``data_len`` given.
    """

    __slots__ = ("data", "dtype", "shape")

    def __init__(
        self,
        *,
        dtype: str,
        shape: Sequence[int],
        data: Any = None,
        data_ptr: int | None = None,
        data_len: int | None = None,
    ):
        name = _FRAMEWORK_NAMES.get(dtype, dtype)
        if name not in BITS:
            raise _invalid(f"TensorSpec: unknown dtype {dtype!r}")
        if data_ptr is not None or data_len is not None:
            raise _invalid(
                "TensorSpec takes the tensor's memory as `data` (an object holding its bytes),"
                " not as an address (`data_ptr`, `data_len`)",
                cls=WrongTypeError,
            )
        shape = [int(d) for d in shape]
        if dtype == "float4_e2m1fn_x2" and shape:
            shape[-1] *= 2
        self.dtype = name
        self.shape = shape
        self.data = data

    def __repr__(self) -> str:
        return f"TensorSpec(dtype={self.dtype!r}, shape={self.shape})"


def _specs(tensor_dict: Mapping[str, Mapping[str, Any]], where: str) -> list[tuple]:
    """``(name, dtype, shape, data)`` of ``{"dtype", "shape", "data"}`` dicts, checked."""
    if not isinstance(tensor_dict, Mapping):
        raise TypeError(f"{where}: expected a dict of tensors, got {type(tensor_dict).__name__}")
    specs = []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"{where}: tensor names must be str, got {type(name).__name__}")
        try:
            if isinstance(spec, TensorSpec):
                dtype, shape, data = spec.dtype, spec.shape, spec.data
            else:
                dtype, shape, data = spec["dtype"], spec["shape"], spec["data"]
        except (KeyError, TypeError):
            raise TypeError(
                f"{where}: tensor `{name}` must be a dict with `dtype`, `shape` and `data`"
            ) from None
        dtype = _FRAMEWORK_NAMES.get(dtype, dtype)
        if dtype not in BITS:
            raise _invalid(f"{where}: tensor `{name}` has an unknown dtype {dtype!r}")
        shape = list(shape)
        if not all(_uint(d) for d in shape):
            raise _invalid(f"{where}: tensor `{name}` has shape {shape}, not a list of sizes")
        view = memoryview(data).cast("B")
        count = 1
        for d in shape:
            count *= d
        if count * BITS[dtype] != 8 * len(view):
            raise _invalid(
                f"{where}: tensor `{name}` ({dtype}, shape {shape}) has {len(view)} bytes of"
                " data, which does not match"
            )
        specs.append((name, dtype, shape, view))
    return specs


def serialize(
    tensor_dict: Mapping[str, Mapping[str, Any]], metadata: Mapping[str, str] | None = None
) -> bytes:
    """The bytes of a safetensors file holding ``tensor_dict``, as ``safetensors.serialize``
    gives them: each value is ``{"dtype": "float32" (or "F32"), "shape": [...], "data":
    bytes}``.

    Raises:
        TypeError: a name, tensor or metadata value of the wrong type.
        ValueError (InvalidInputError): an unknown dtype, data that does not match its shape.
    """
    meta = check_metadata(metadata, WHERE)
    return _native.serialize(_specs(tensor_dict, WHERE), meta)


def serialize_file(
    tensor_dict: Mapping[str, Mapping[str, Any]],
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    engine: Engine | None = None,
) -> None:
    """Saves ``tensor_dict`` (as :func:`serialize` takes it) to ``filename``, durably and
    atomically (see :func:`fastensor.torch.save_file`)."""
    path = fspath(filename)
    meta = check_metadata(metadata, path)
    engine_or_default(engine).save(path, _specs(tensor_dict, path), meta)


def deserialize(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The tensors of ``data``, the bytes of a safetensors file, as ``safetensors.deserialize``
    gives them: ``[(name, {"dtype": "F32", "shape": [...], "data": bytearray}), ...]`` (in
    data order).

    Raises:
        ValueError (CorruptError): ``data`` is not valid safetensors.
    """
    body, entries, _ = parse(data)
    return [
        (e.name, {"dtype": e.dtype, "shape": e.shape, "data": bytearray(body[e.start : e.end])})
        for e in entries
    ]
