"""Safetensors in memory: the layout of ``save`` and the checks of ``load`` (no framework).

The layout is the one ``safetensors`` writes, byte for byte: an 8-byte little-endian header
length, a compact JSON header (``__metadata__`` first, then the tensors in data order), padded
with spaces to a multiple of 8, then the tensors' bytes, ordered as the safetensors crate
orders them (the widest dtypes first, then by name). :func:`parse` validates hostile bytes
before anything is allocated and raises :class:`~fastensor.errors.CorruptError`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ._common import PathLike, check_metadata, fspath
from ._engine import Engine, engine_or_default
from .errors import CorruptError, _invalid

#: Bits per element of every dtype name safetensors knows.
BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

#: The safetensors crate's ``Dtype`` order; tensors are laid out by it, descending.
_RANK = {name: i for i, name in enumerate(BITS)}

#: The header size safetensors refuses beyond (100 MB).
MAX_HEADER = 100_000_000

#: What the messages name instead of a file.
WHERE = "<bytes>"


class Entry(NamedTuple):
    """One tensor of a parsed buffer: its bytes are ``data[start:end]``."""

    name: str
    dtype: str
    shape: list[int]
    start: int
    end: int


def _corrupt(message: str) -> CorruptError:
    exc = CorruptError(f"{WHERE}: {message}")
    exc.path = None
    return exc


def layout(
    specs: Sequence[tuple[str, str, Sequence[int], int]],
    metadata: dict[str, str] | None,
) -> tuple[bytes, list[tuple[str, int, int]]]:
    """The header (length prefix, JSON, padding) for ``specs`` ``(name, dtype, shape,
    nbytes)`` and where each tensor's bytes go: ``(name, start, end)`` relative to the end of
    the header, in data order."""
    ordered = sorted(specs, key=lambda s: (-_RANK.get(s[1], -1), s[0]))
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    places = []
    at = 0
    for name, dtype, shape, nbytes in ordered:
        header[name] = {
            "dtype": dtype,
            "shape": [int(d) for d in shape],
            "data_offsets": [at, at + nbytes],
        }
        places.append((name, at, at + nbytes))
        at += nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, places


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the key `{k}` appears twice")
        out[k] = v
    return out


def _uint(value: object) -> bool:
    return type(value) is int and value >= 0


def parse(data: bytes | bytearray | memoryview) -> tuple[memoryview, list[Entry], dict | None]:
    """Validates the safetensors buffer ``data``: returns the view of its data section, its
    tensors in data order (safetensors gives them in no fixed order), and its
    ``__metadata__`` (``None`` when absent).

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
    if len(view) < 8:
        raise _corrupt(f"{len(view)} bytes are too few for a safetensors header (8 at least)")
    (n,) = struct.unpack("<Q", view[:8])
    if n > MAX_HEADER:
        raise _corrupt(f"the header length {n} is beyond the limit of {MAX_HEADER} bytes")
    if n > len(view) - 8:
        raise _corrupt(f"the header length {n} is beyond the {len(view) - 8} bytes that follow")
    try:
        header = json.loads(
            bytes(view[8 : 8 + n]).decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _corrupt(f"the header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise _corrupt(f"the header is a JSON {type(header).__name__}, not an object")
    body = view[8 + n :]
    metadata = header.pop("__metadata__", None)
    if metadata is not None and (
        not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())
    ):
        raise _corrupt("`__metadata__` is not a map of str to str")
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise _corrupt(f"tensor `{name}`: its header entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in BITS:
            raise _corrupt(f"tensor `{name}`: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_uint(d) for d in shape):
            raise _corrupt(f"tensor `{name}`: shape {shape!r} is not a list of sizes")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_uint(o) for o in offsets):
            raise _corrupt(f"tensor `{name}`: data_offsets {offsets!r} are not two offsets")
        start, end = offsets
        if end < start:
            raise _corrupt(f"tensor `{name}`: data_offsets [{start}, {end}] end before they begin")
        if end > len(body):
            raise _corrupt(
                f"tensor `{name}`: data_offsets [{start}, {end}] are beyond the"
                f" {len(body)} bytes of data"
            )
        count = 1
        for d in shape:
            count *= d
            if count * BITS[dtype] > 8 * len(body):
                break  # (already too large: keeps the product small)
        bits = count * BITS[dtype]
        if bits % 8 or bits // 8 != end - start:
            raise _corrupt(
                f"tensor `{name}`: shape {shape} of {dtype} does not match its"
                f" {end - start} bytes at data_offsets [{start}, {end}]"
            )
        entries.append(Entry(name, dtype, shape, start, end))
    entries.sort(key=lambda e: (e.start, e.end))
    at = 0
    for e in entries:
        if e.start != at:
            what = "overlap the previous tensor" if e.start < at else "leave a gap before them"
            raise _corrupt(
                f"tensor `{e.name}`: data_offsets [{e.start}, {e.end}] {what} (expected {at})"
            )
        at = e.end
    if at != len(body):
        raise _corrupt(f"the tensors cover {at} bytes, but {len(body)} bytes of data follow")
    return body, entries, metadata


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
}


def _specs(tensor_dict: Mapping[str, Mapping[str, Any]], where: str) -> list[tuple]:
    """``(name, dtype, shape, data)`` of ``{"dtype", "shape", "data"}`` dicts, checked."""
    if not isinstance(tensor_dict, Mapping):
        raise TypeError(f"{where}: expected a dict of tensors, got {type(tensor_dict).__name__}")
    specs = []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"{where}: tensor names must be str, got {type(name).__name__}")
        try:
            dtype, shape, data = spec["dtype"], spec["shape"], spec["data"]
        except (KeyError, TypeError):
            raise TypeError(
                f"{where}: tensor `{name}` must be a dict with `dtype`, `shape` and `data`"
            ) from None
        dtype = _FRAMEWORK_NAMES.get(dtype, dtype)
        if dtype not in BITS:
            raise _invalid(f"{where}: tensor `{name}` has an unknown dtype {spec['dtype']!r}")
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
    specs = _specs(tensor_dict, WHERE)
    header, places = layout([(n, d, s, len(b)) for n, d, s, b in specs], meta)
    src = {n: b for n, _, _, b in specs}
    out = bytearray(header)
    for name, _, _ in places:
        out += src[name]
    return bytes(out)


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
