"""``safe_open``: a safetensors file opened once, its tensors read on demand, whole or in
part (:meth:`SafeOpenBase.get_slice`), as ``safetensors.safe_open`` does.

The framework front ends (:class:`fastensor.torch.safe_open`,
:class:`fastensor.numpy.safe_open`) subclass :class:`SafeOpenBase` and say how whole tensors
are read (``_read``); this module reads slices for both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from . import _native, _slice_index
from .errors import NotFoundError, _invalid

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

    ``get_shape()`` and ``get_dtype()`` describe the tensor; ``slice_[index]`` reads the
    part ``index`` selects and returns it as a new tensor (or array) that owns its memory.
    An index means what it means to the framework (see :mod:`fastensor._slice_index`): for
    ``"pt"``, what it means to torch, as in ``safetensors`` (bounds clamped, ``None``,
    ``...``, steps, lists and tensors); for ``"np"``, numpy's basic indexing with positive
    steps. Where the part is a strided view of the tensor, only the byte runs it covers are
    read, through the file already open; a part only advanced indexing gives is taken from
    the whole tensor. Opened with ``verify=True``, the whole tensor is read and checked
    (a checksum covers a whole tensor), then the same part taken from it.

    Raises:
        SafetensorError (InvalidInputError, a ValueError): an index the framework refuses
            (also an IndexError when out of range, a TypeError when of the wrong type),
            naming the file and the tensor.
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
        where = (opened._path, name)
        if opened._framework == "pt" and dtype not in _PACKED:
            from ._torch_dtypes import FROM_NAME

            torch_dtype = _torch_dtype(dtype, opened._path, name, FROM_NAME)
            part = _slice_index.resolve_torch(index, shape, torch_dtype, where)
            if isinstance(part, _slice_index.Gathered):
                return self._gathered(part, torch_dtype, where)
        else:
            part = _slice_index.resolve_numpy(index, shape, where)
        if opened._verify:
            # A checksum covers a whole tensor: read it whole (checked), then take the part
            # (of a packed dtype: read as the part, once the whole tensor checked).
            whole = opened.get_tensor(name)
            if dtype not in _PACKED:
                return _slice_index.take_strided(whole, part)
        make = _torch_target if opened._framework == "pt" else _numpy_target
        out, raw = make(dtype, part.shape, opened._path, name)
        if raw.nbytes and not part.empty:
            _native.read_slice(file, name, part.selection, raw)
        if opened._framework == "pt" and str(opened._device) != "cpu":
            out = out.to(opened._device)
        return out

    def _gathered(self, part: _slice_index.Gathered, torch_dtype, where):
        """A part only torch's advanced indexing gives: from the whole tensor, which is
        read only when the part holds any element."""
        name, _, shape, _, _ = self._entry
        if part.shape is not None and math.prod(part.shape) == 0:
            empty = _slice_index.on_broadcast(part.index, shape, torch_dtype, where)
            return empty.to(self._opened._device)
        whole = self._opened.get_tensor(name)
        return _slice_index.take_gathered(whole, part, where)

    def __repr__(self) -> str:
        name, dtype, shape, _, _ = self._entry
        return f"<SafeSlice `{name}` {dtype} {shape}>"


#: Dtypes stored several elements to a framework element (torch's float4_e2m1fn_x2): an
#: index applies to the file's logical shape, resolved as numpy's basic indexing.
_PACKED = frozenset({"F4"})


def _torch_dtype(dtype: str, path: str, name: str, known: Mapping[str, Any]):
    dt = known.get(dtype)
    if dt is None:
        raise _invalid(f"{path}: tensor `{name}` has dtype {dtype}, which torch cannot hold", path)
    return dt


# The tensors a slice is read into, per framework: (result, its bytes).


def _torch_target(dtype: str, shape: list[int], path: str, name: str):
    import torch

    from ._torch_dtypes import FROM_NAME, torch_shape

    dt = _torch_dtype(dtype, path, name, FROM_NAME)
    try:
        out = torch.empty(torch_shape(dtype, shape), dtype=dt)
    except ValueError as exc:
        raise _invalid(
            f"{path}: a slice of `{name}` ({dtype}, shape {shape}): {exc}", path
        ) from exc
    return out, out.reshape(-1).view(torch.uint8)


def _numpy_target(dtype: str, shape: list[int], path: str, name: str):
    import numpy as np

    from ._numpy_dtypes import FROM_NAME as _FROM_NAME

    dt = _FROM_NAME.get(dtype)
    if dt is None:
        raise _invalid(f"{path}: tensor `{name}` has dtype {dtype}, which numpy cannot hold", path)
    out = np.empty(tuple(shape), dtype=dt)
    return out, out.reshape(-1).view(np.uint8)
