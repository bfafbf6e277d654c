"""Pieces the torch and numpy front ends share."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Union

from . import _native
from .errors import OutOfMemoryError, _invalid

PathLike = Union[str, "os.PathLike[str]"]

#: Device memory of a tensor read from a file is allocated with this many bytes to spare and
#: placed (:func:`pad_for`) so that its address and its file offset agree modulo it: a direct
#: read can then fill it with no copy (host memory is laid out by the native side).
IO_ALIGN: int = _native.DATA_ALIGN


def fspath(path: PathLike) -> str:
    """``path`` as a string; a clear error for anything else."""
    try:
        return os.fspath(path)
    except TypeError:
        raise TypeError(
            f"expected a path (str or os.PathLike), got {type(path).__name__}"
        ) from None


def is_sharded(path: PathLike) -> bool:
    """True when ``path`` names a sharded checkpoint: a directory or a ``*.index.json``;
    under an object prefix (``s3://``), any name but a ``.safetensors`` one (the native
    checkpoint code decides, at the place the engine resolves ``path`` to; no request is
    made)."""
    return _native.is_sharded(fspath(path))


def has_directories(path: str) -> bool:
    """Whether the place ``path`` names, as the engine resolves it, has directories of its
    own (a local file system, where ``os`` calls apply); false for an object store
    (``s3://``)."""
    return _native.has_directories(path)


def check_metadata(metadata: Mapping[str, str] | None, path: str) -> dict[str, str] | None:
    """The metadata as a plain ``dict[str, str]``, as safetensors requires."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise TypeError(
            f"{path}: metadata must be a dict of str to str, got {type(metadata).__name__}"
        )
    out = {}
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(
                f"{path}: metadata must map str to str;"
                f" got {type(k).__name__} -> {type(v).__name__}"
            )
        out[k] = v
    return out


def check_names(tensors: Mapping[str, object], path: str) -> None:
    """Refuses a mapping whose keys are not strings."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"{path}: expected a dict of tensors, got {type(tensors).__name__}")
    for k in tensors:
        if not isinstance(k, str):
            raise TypeError(f"{path}: tensor names must be str, got {type(k).__name__} ({k!r})")


def pad_for(file_offset: int, base_address: int, nbytes: int, itemsize: int) -> int:
    """Bytes to skip in a buffer starting at ``base_address`` (with :data:`IO_ALIGN` to spare)
    for a tensor at ``file_offset`` in its file: the native placement rule
    (``fastensor::checkpoint::direct_read_pad``)."""
    return _native.direct_read_pad(file_offset, base_address, nbytes, itemsize)


def unknown_dtype(path: str, name: str, dtype: str, framework: str) -> Exception:
    return _invalid(
        f"{path}: tensor `{name}` has dtype {dtype}, which {framework} cannot hold", path
    )


def allocation_error(
    path: str, entry, exc: BaseException, framework: str, out_of_memory: bool = False
) -> Exception:
    """The fastensor error for a tensor of ``path`` that ``framework`` could not make:
    :class:`OutOfMemoryError` when memory ran out (``out_of_memory``, ``exc`` a
    ``MemoryError``, or a message saying so), else an invalid-input error naming the tensor,
    its dtype and shape."""
    name, dtype, shape, _, nbytes = entry
    if out_of_memory or isinstance(exc, MemoryError) or "can't allocate memory" in str(exc):
        err: Exception = OutOfMemoryError(
            f"{path}: tensor `{name}` ({nbytes} bytes) cannot be allocated: {exc}"
        )
    else:
        err = _invalid(
            f"{path}: tensor `{name}` ({dtype}, shape {shape}) cannot be made in {framework}: "
            f"{exc}",
            path,
        )
    err.path = path  # type: ignore[attr-defined]
    return err


def read_new(file, entries, empty_for: Callable[[Any], tuple[Any, Any, int]]) -> dict[str, Any]:
    """The tensors ``entries`` (name, dtype, shape, offset, bytes) of the open ``file``, each
    in new memory made by ``empty_for(entry)`` (the tensor, the ``uint8`` buffer holding
    it, its byte offset there), filled by one ``read_into``."""
    out, targets = {}, []
    for e in entries:
        t, raw, at = empty_for(e)
        out[e[0]] = t
        if e[4]:
            targets.append((e[0], raw, at, e[4]))
    file.read_into(targets)
    return out
