"""Loads into new host memory: one native call for the whole load, tensors made from the
DLPack capsules it returns (no byte copied).

What the tensors are: each owns a storage of its own over its bytes in the loaded memory,
which is freed (or unmapped) when the last tensor of the load dies. Where the engine maps
the file (its default, see ``Engine(mapped_loads=...)``) that memory is a private,
copy-on-write mapping of the file under a read lease: writing a tensor changes only this
process's copy of the pages written; renaming or removing the file changes nothing; a
program that opens the file for writing or truncates it waits until the tensors' pages are
moved into memory of this process, so they keep their bytes. Where no lease can be had the
file is read into memory of its own instead (or, with ``Engine(unprotected_maps=True)``,
mapped unprotected: changes then show through, as with every mmap-based loader).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _native
from ._common import unknown_dtype
from .errors import _invalid

if TYPE_CHECKING:
    import numpy as np
    import torch


def _load(
    native,
    path: str,
    names: list[str] | None,
    verify: bool,
    versioned: bool,
    framework: str,
    make: Callable[[str, str, list[int], Any], Any],
) -> dict[str, Any]:
    """The tensors of ``path`` (all in file order, or ``names`` in their order), each made
    by ``make(name, dtype, shape, capsule)``; ``None`` from it means a dtype ``framework``
    cannot hold, and an error it raises becomes one naming the file and the tensor."""
    tensors, _metadata, _placement = native.load_new(
        path, names, versioned=versioned, verify=verify
    )
    return _made(path, tensors, names, framework, make)


def _made(
    path: str,
    tensors: list,
    names: list[str] | None,
    framework: str,
    make: Callable[[str, str, list[int], Any], Any],
) -> dict[str, Any]:
    """:func:`_load`'s dict of the native load's ``tensors``."""
    out: dict[str, Any] = {}
    for name, dtype, shape, capsule in tensors:
        try:
            made = make(name, dtype, shape, capsule)
        except (RuntimeError, ValueError) as exc:
            err = _invalid(
                f"{path}: tensor `{name}` ({dtype}, shape {shape}) cannot be made in "
                f"{framework}: {exc}",
                path,
            )
            raise err from exc
        if made is None:
            raise unknown_dtype(path, name, dtype, framework)
        out[name] = made
    if names is not None:
        return {n: out[n] for n in names}
    return out


def _make_torch(name: str, dtype: str, shape: list[int], capsule: Any) -> torch.Tensor | None:
    """A torch tensor of ``dtype`` and ``shape`` over a ``uint8`` capsule (``None``: a dtype
    torch lacks)."""
    import torch

    from ._torch_dtypes import FROM_NAME, torch_shape

    dt = FROM_NAME.get(dtype)
    if dt is None:
        return None
    return torch.from_dlpack(capsule).view(dt).view(torch_shape(dtype, shape))


def _torch_name() -> str:
    import torch

    return f"torch {torch.__version__}"


def load_host(
    native, path: str, names: list[str] | None = None, verify: bool = False
) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` (all in file order, or ``names`` in their order) in new host
    memory, as torch tensors; with ``verify``, each checked against its stored checksum."""
    return _load(native, path, names, verify, False, _torch_name(), _make_torch)


def read_host(file, path: str, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors ``names`` (all, in file order, when ``None``) of the open native ``file``
    read into new host memory, as torch tensors: one arena the native side lays out for
    direct reads (each tensor read whole, checked where ``file`` verifies)."""
    return _made(path, _native.read_new(file, names), names, _torch_name(), _make_torch)


def load_host_later(
    native, path: str, names: list[str] | None = None
) -> tuple[dict[str, torch.Tensor], Any]:
    """:func:`load_host` returning as soon as the file is mapped, its pages brought in by a
    thread of their own: the tensors, and the ``PendingPages`` whose ``wait()`` waits for
    every page (``None`` where the load was whole). Reading a tensor before ``wait()``
    returns is correct but slower: for callers that hand the tensors on without reading
    them (building a model), then wait. The lease guards the pages not brought in yet as
    well: a writer of the file waits until they are all in memory of this process."""
    tensors, _metadata, pending = native.load_new_later(path, names)
    return _made(path, tensors, names, _torch_name(), _make_torch), pending


class _Exported:
    """A DLPack capsule offered through ``__dlpack__`` (what ``numpy.from_dlpack`` takes)."""

    __slots__ = ("_capsule",)

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):  # noqa: ANN001
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


def _numpy_maker(from_name: dict) -> Callable[[str, str, list[int], Any], Any]:
    """``make`` for numpy: writable arrays (``from_name``: dtype name -> numpy dtype;
    numpy makes writable arrays only from version 1 capsules)."""
    import numpy as np

    def make(name: str, dtype: str, shape: list[int], capsule: Any) -> np.ndarray | None:
        dt = from_name.get(dtype)
        if dt is None:
            return None
        return np.from_dlpack(_Exported(capsule)).view(dt).reshape(tuple(shape))

    return make


def load_host_numpy(
    native, path: str, from_name: dict, names: list[str] | None = None, verify: bool = False
) -> dict[str, np.ndarray]:
    """:func:`load_host` for numpy (``from_name``: dtype name -> numpy dtype)."""
    return _load(native, path, names, verify, True, "numpy", _numpy_maker(from_name))


def read_host_numpy(
    file, path: str, from_name: dict, names: list[str] | None = None
) -> dict[str, np.ndarray]:
    """:func:`read_host` for numpy (``from_name``: dtype name -> numpy dtype)."""
    tensors = _native.read_new(file, names, versioned=True)
    return _made(path, tensors, names, "numpy", _numpy_maker(from_name))
