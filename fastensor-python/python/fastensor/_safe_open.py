"""``safe_open``: a safetensors file opened once, its tensors read on demand, whole or in
part (:meth:`SafeOpenBase.get_slice`), as ``safetensors.safe_open`` does.

The framework front ends (:class:`fastensor.torch.safe_open`,
:class:`fastensor.numpy.safe_open`) subclass :class:`SafeOpenBase` and say how whole tensors
are read (``_read``); this module reads slices for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import _native
from .errors import NotFoundError, SafetensorError, _invalid

#: One tensor of the file: ``(name, dtype, shape, file_offset, nbytes)``.
Entry = tuple[str, str, list[int], int, int]


class SafeOpenBase:
    """A safetensors file opened once: names, metadata, and tensors read on demand.

    Use it as a context manager, as ``safetensors.safe_open`` is used; every read goes
    through the file opened here. Leaving the context (or :meth:`close`) releases the file
    at once (it may be deleted or replaced right after); tensors already read stay valid,
    and any later call raises :class:`~fastensor.errors.SafetensorError` ("File is closed").
    Opened with ``verify=True``, every tensor is checked against the checksum saved with it
    as it is read (see :mod:`fastensor._checksum`).
    """

    #: The framework of the tensors made: ``"pt"`` or ``"np"``.
    _framework = "np"
    _device: Any = "cpu"
    #: Whether reads are checked against the checksums saved with the file.
    _verify = False

    def __init__(self, native_file, path: str):
        self._file = native_file
        self._path = path
        self._entries = {e[0]: e for e in native_file.entries()}

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Closes the file (tensors already read stay valid)."""
        self._file = None

    def _open_file(self):
        if self._file is None:
            raise _invalid(f"File is closed: {self._path}", self._path)
        return self._file

    def keys(self) -> list[str]:
        """The tensor names, sorted (as ``safetensors`` gives them)."""
        self._open_file()
        return sorted(self._entries)

    def offset_keys(self) -> list[str]:
        """The tensor names in the order of their data in the file."""
        self._open_file()
        return sorted(self._entries, key=lambda n: self._entries[n][3])

    def metadata(self) -> dict[str, str] | None:
        """The file's ``__metadata__`` map (``None`` when it has none, as in safetensors)."""
        return self._open_file().metadata() or None

    def _entry(self, name: str) -> Entry:
        self._open_file()
        try:
            return self._entries[name]
        except KeyError:
            exc = NotFoundError(f"{self._path}: no tensor `{name}` in the checkpoint")
            exc.path = self._path
            raise exc from None

    def _read(self, entries: list[Entry]) -> dict[str, Any]:
        """Reads the tensors ``entries`` whole into new memory (the front ends define it)."""
        raise NotImplementedError

    def get_tensor(self, name: str):
        """The tensor ``name``, read now into new memory (on the file's device)."""
        return self._read([self._entry(name)])[name]

    def get_tensors(self) -> dict[str, Any]:
        """Every tensor of the file, read now as one job, by name (in data order)."""
        self._open_file()
        entries = sorted(self._entries.values(), key=lambda e: e[3])
        return self._read(entries)

    def get_slice(self, name: str) -> SafeSlice:
        """A handle on tensor ``name`` that reads only what it is indexed with::

        with safe_open("model.safetensors", framework="pt") as f:
            part = f.get_slice("embedding")[:, :1024]
        """
        return SafeSlice(self, self._entry(name))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._path!r} ({len(self._entries)} tensors)>"


class SafeSlice:
    """One tensor of an open file, read in part when indexed (``safetensors``' slice).

    ``get_shape()`` and ``get_dtype()`` describe the tensor; ``slice_[...]`` reads the part
    an index selects and returns it as a new tensor (or array) that owns its memory. An
    index is a tuple of integers (negative ones count from the end) and slices (``a:b`` or
    ``a:b:c`` with a positive step), leading dimensions first (``...`` stands for the rest),
    or an empty list (no rows). Only the byte runs the selection covers are read, through
    the file already open. Unlike numpy, a bound past a dimension's end is an error (as in
    safetensors), not clamped.

    Raises:
        SafetensorError (InvalidInputError, a ValueError): an index out of range, or of a
            kind not supported (a non-empty list, a negative step); messages as
            safetensors words them.
    """

    def __init__(self, opened: SafeOpenBase, entry: Entry):
        self._opened = opened
        self._entry = entry

    def get_shape(self) -> list[int]:
        """The tensor's shape, as the header records it."""
        return list(self._entry[2])

    def get_dtype(self) -> str:
        """The tensor's safetensors dtype name, e.g. ``"F32"``."""
        return self._entry[1]

    def __len__(self) -> int:
        shape = self._entry[2]
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    def __getitem__(self, index: Any):
        name, dtype, shape, _, _ = self._entry
        opened = self._opened
        file = opened._open_file()
        selection, new_shape = _select(index, shape)
        if opened._verify:
            # A checksum covers a whole tensor: read it whole (checked), then select.
            whole = opened.get_tensor(name)
            if dtype not in _PACKED:
                return _take(whole, selection)
        make = _torch_target if opened._framework == "pt" else _numpy_target
        out, raw = make(dtype, new_shape, opened._path, name)
        if raw.nbytes:
            _native.read_slice(file, name, [s[:3] for s in selection], raw)
        if opened._framework == "pt" and str(opened._device) != "cpu":
            out = out.to(opened._device)
        return out

    def __repr__(self) -> str:
        name, dtype, shape, _, _ = self._entry
        return f"<SafeSlice `{name}` {dtype} {shape}>"


#: What an index keeps of one dimension: ``(start, count, step, kept)``; ``kept`` is false
#: where an integer selected one index (the dimension is dropped from the result).
Selection = tuple[int, int, int, bool]


#: Dtypes stored several elements to a framework element (torch's float4_e2m1fn_x2): a
#: selection in their logical shape is not one in the framework's.
_PACKED = frozenset({"F4"})


def _take(whole: Any, selection: list[Selection]):
    """The part of ``whole`` that ``selection`` keeps, as a new contiguous tensor or
    array."""
    index = tuple(
        slice(start, start + count * step, step) if kept else start
        for start, count, step, kept in selection
    )
    part = whole[index]
    return part.clone() if hasattr(part, "clone") else part.copy()


# Indexing: a Python index -> one (start, count, step) per dimension.


def _bound(value: object, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _invalid(f"slice {what} must be an integer, got {type(value).__name__}")
    return value


def _shown(part: object) -> str:
    """One part of an index as safetensors prints it (``2:``, ``:20``, ``0``)."""
    if isinstance(part, slice):
        text = ("" if part.start is None else str(part.start)) + ":"
        text += "" if part.stop is None else str(part.stop)
        if part.step not in (None, 1):
            text += f":{part.step}"
        return text
    return str(part)


def _parts(index: Any, rank: int) -> list[Any]:
    """The index as a list of ints and slices, one per leading dimension."""
    if isinstance(index, list):
        if index:
            raise _invalid("Non empty lists are not implemented")
        return [slice(0, 0)]
    parts = list(index) if isinstance(index, tuple) else [index]
    if any(p is Ellipsis for p in parts):
        at = parts.index(Ellipsis)
        rest = [p for p in parts[at + 1 :] if p is not Ellipsis]
        if len(rest) != len(parts) - at - 1:
            raise _invalid("an index can only have a single ellipsis ('...')")
        fill = max(rank - at - len(rest), 0)
        parts = parts[:at] + [slice(None)] * fill + rest
    for p in parts:
        if not isinstance(p, slice) and (not isinstance(p, int) or isinstance(p, bool)):
            raise _invalid(
                f"only integers, slices (`:`), `...` and an empty list are valid indices,"
                f" got {type(p).__name__}"
            )
    return parts


def _select(index: Any, shape: Sequence[int]) -> tuple[list[Selection], list[int]]:
    """What ``index`` keeps of every dimension of ``shape``, and the result's shape."""
    rank = len(shape)
    parts = _parts(index, rank)
    if len(parts) > rank:
        raise _invalid(
            f"Error during slicing [{', '.join(map(_shown, parts))}] with shape {list(shape)}:"
            f" {len(parts)} indices for a tensor of {rank} dimensions"
        )
    where = f"[{', '.join(map(_shown, parts))}] with shape {list(shape)}"

    def out_of_bounds(asked: int, dim: int) -> SafetensorError:
        return _invalid(
            f"Error during slicing {where}: index {asked} out of bounds for tensor dimension"
            f" #{dim} of size {shape[dim]}"
        )

    selection, new_shape = [], []
    for dim, size in enumerate(shape):
        if dim >= len(parts):
            selection.append((0, size, 1, True))
            new_shape.append(size)
            continue
        part = parts[dim]
        if not isinstance(part, slice):
            i = part + size if part < 0 else part
            if i < 0:
                raise _invalid(f"Invalid index {part} for dimension {dim} of size {size}")
            if i >= size:
                raise out_of_bounds(i, dim)
            selection.append((i, 1, 1, False))
            continue
        start, stop = _bound(part.start, "start"), _bound(part.stop, "stop")
        step = 1 if part.step is None else _bound(part.step, "step")
        if step <= 0:
            what = "a step of 0" if step == 0 else "negative steps"
            raise _invalid(f"Error during slicing {where}: {what} is not supported")
        start = 0 if start is None else (start + size if start < 0 else start)
        stop = size if stop is None else (stop + size if stop < 0 else stop)
        if start < 0 or stop < 0:
            raise _invalid(
                f"Invalid index {min(start, stop) - size} for dimension {dim} of size {size}"
            )
        count = max(0, -(-(stop - start) // step))
        if count and (start >= size or stop > size):
            raise out_of_bounds(start if start >= size else stop - 1, dim)
        if not count:
            start = min(start, size)
        selection.append((start, count, step, True))
        new_shape.append(count)
    return selection, new_shape


# The tensors a slice is read into, per framework: (result, its bytes).


def _torch_target(dtype: str, shape: list[int], path: str, name: str):
    import torch

    from ._torch_dtypes import FROM_NAME, torch_shape

    dt = FROM_NAME.get(dtype)
    if dt is None:
        raise _invalid(f"{path}: tensor `{name}` has dtype {dtype}, which torch cannot hold", path)
    try:
        out = torch.empty(torch_shape(dtype, shape), dtype=dt)
    except ValueError as exc:
        raise _invalid(
            f"{path}: a slice of `{name}` ({dtype}, shape {shape}): {exc}", path
        ) from exc
    return out, out.reshape(-1).view(torch.uint8)


def _numpy_target(dtype: str, shape: list[int], path: str, name: str):
    import numpy as np

    from .numpy import _FROM_NAME

    dt = _FROM_NAME.get(dtype)
    if dt is None:
        raise _invalid(f"{path}: tensor `{name}` has dtype {dtype}, which numpy cannot hold", path)
    out = np.empty(tuple(shape), dtype=dt)
    return out, out.reshape(-1).view(np.uint8)
