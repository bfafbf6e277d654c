"""Safetensors checkpoints for NumPy, moved by fastensor's engine.

The names follow ``safetensors.numpy``. Arrays returned by :func:`load_file` and
``safe_open`` are writable and each views memory the native side laid out and filled with
the GIL released (or the file mapped), freed when the last array of the same read dies;
those of :func:`load`, which reads the bytes of a safetensors file (:func:`save` gives
them), are allocated by NumPy. The save functions read the caller's arrays in place while they run
(C-contiguous little-endian ones without a copy); :func:`save_file_async` copies them first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from . import _bytes, _native
from ._checksum import open_file
from ._common import (
    PathLike,
    check_metadata,
    check_names,
    fspath,
    unknown_dtype,
)
from ._engine import Engine, engine_or_default, watch_pending_saves
from ._host_load import load_host_numpy, read_host_numpy
from ._numpy_dtypes import FROM_NAME as _FROM_NAME
from ._numpy_dtypes import TO_NAME as _TO_NAME
from ._safe_open import SafeOpenBase
from .errors import _invalid

__all__ = [
    "load",
    "load_file",
    "load_selected",
    "safe_open",
    "save",
    "save_file",
    "save_file_async",
]


def _bytes_of(a: np.ndarray) -> np.ndarray:
    """The bytes of the C-contiguous ``a`` as a flat ``uint8`` array over the same memory."""
    return a.reshape(-1).view(np.uint8)


def _save_specs(tensors: Mapping[str, np.ndarray], path: str):
    check_names(tensors, path)
    specs = []
    for name, a in tensors.items():
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{path}: `{name}` is a {type(a).__name__}, not a numpy.ndarray")
        if a.dtype.byteorder == ">":  # safetensors is little-endian
            a = a.astype(a.dtype.newbyteorder("<"))
        dtype = _TO_NAME.get(a.dtype)
        if dtype is None:
            raise _invalid(
                f"{path}: array `{name}` has dtype {a.dtype}, which safetensors cannot hold", path
            )
        if not a.flags.c_contiguous:  # (np.ascontiguousarray would make 0-d arrays 1-d)
            a = a.copy(order="C")
        specs.append((name, dtype, list(a.shape), _bytes_of(a)))
    return specs


def save_file(
    tensor_dict: Mapping[str, np.ndarray],
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    engine: Engine | None = None,
    checksum: bool = False,
) -> None:
    """Saves ``tensor_dict`` to ``filename`` as a safetensors file, durably and atomically
    (see :func:`fastensor.torch.save_file`, and there ``checksum``)."""
    path = fspath(filename)
    engine = engine_or_default(engine)
    meta = check_metadata(metadata, path)
    specs = _save_specs(tensor_dict, path)
    engine.save(path, specs, meta, checksum=checksum)


def save_file_async(
    tensor_dict: Mapping[str, np.ndarray],
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    engine: Engine | None = None,
    checksum: bool = False,
) -> _native.SaveHandle:
    """Snapshots the arrays, then saves them in the background (see
    :func:`fastensor.torch.save_file_async`)."""
    path = fspath(filename)
    engine = engine_or_default(engine)
    meta = check_metadata(metadata, path)
    watch_pending_saves()
    specs = _save_specs(tensor_dict, path)
    return engine.save_async(path, specs, meta, checksum=checksum)


def _read_new(file, path: str, entries) -> dict[str, np.ndarray]:
    return read_host_numpy(file, path, _FROM_NAME, [e[0] for e in entries])


def load_file(
    filename: PathLike, *, engine: Engine | None = None, verify: bool = False
) -> dict[str, np.ndarray]:
    """Loads every tensor of the safetensors file ``filename`` as a numpy array; with
    ``verify``, each checked as it arrives against the checksum saved with it.

    Raises:
        FileNotFoundError (NotFoundError): no such file.
        ValueError (CorruptError): not a valid safetensors file, or (with ``verify``) a
            checksum that does not match; or a dtype numpy lacks (BF16, F8), naming the
            tensor.
    """
    path = fspath(filename)
    return load_host_numpy(engine_or_default(engine), path, _FROM_NAME, verify=verify)


def load_selected(
    filename: PathLike, names: Iterable[str], *, engine: Engine | None = None
) -> dict[str, np.ndarray]:
    """Loads only the arrays ``names`` of ``filename``; only their bytes are read.

    Raises:
        FileNotFoundError (NotFoundError): no such file, or a name the file lacks.
    """
    path = fspath(filename)
    wanted = list(dict.fromkeys(names))
    return load_host_numpy(engine_or_default(engine), path, _FROM_NAME, wanted)


class safe_open(SafeOpenBase):  # noqa: N801 (named as in safetensors)
    """Opens a safetensors file for reads on demand (``framework="np"``)."""

    def __init__(
        self,
        filename: PathLike,
        framework: str = "np",
        device: str = "cpu",
        *,
        engine=None,
        verify: bool = False,
    ):
        if framework not in ("np", "numpy"):
            raise ValueError(f"fastensor.numpy.safe_open: framework {framework!r} is not 'np'")
        if device != "cpu":
            raise ValueError(
                f"fastensor.numpy.safe_open: numpy arrays live on the cpu, not {device!r}"
            )
        path = fspath(filename)
        self._verify = verify
        super().__init__(open_file(engine_or_default(engine), path, verify), path)

    def _read(self, entries) -> dict[str, np.ndarray]:
        return _read_new(self._open_file(), self._path, entries)


def save(tensor_dict: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """The bytes of a safetensors file holding ``tensor_dict``, as ``safetensors.numpy.save``
    gives them (the same layout, byte for byte). Arrays may be non-contiguous or big-endian
    (saved as their contiguous little-endian copy). ``metadata`` is a dict of str to str.

    Raises:
        TypeError: a name, array or metadata value of the wrong type.
        ValueError (InvalidInputError): a dtype safetensors cannot hold.
    """
    where = _bytes.WHERE
    meta = check_metadata(metadata, where)
    specs = _save_specs(tensor_dict, where)
    return _native.serialize(specs, meta)


def load(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of ``data``, the bytes of a safetensors file (as ``safetensors.numpy.load``
    reads them). Each array owns its memory (a copy of its bytes), and is writable.

    ``data`` is checked before anything is allocated.

    Raises:
        ValueError (CorruptError): ``data`` is not valid safetensors; the message names the
            problem and the tensor.
        ValueError (InvalidInputError): a dtype numpy lacks (BF16, F8).
    """
    body, entries, _ = _bytes.parse(data)
    out: dict[str, np.ndarray] = {}
    for e in entries:
        dt = _FROM_NAME.get(e.dtype)
        if dt is None:
            raise unknown_dtype(_bytes.WHERE, e.name, e.dtype, "numpy")
        if e.end == e.start:
            out[e.name] = np.empty(tuple(e.shape), dtype=dt)
            continue
        count = (e.end - e.start) // dt.itemsize
        a = np.frombuffer(body, dtype=dt, count=count, offset=e.start)
        out[e.name] = a.reshape(tuple(e.shape)).copy()
    return out
