"""Safetensors checkpoints for PyTorch, moved by fastensor's engine.

The names follow ``safetensors.torch``, so switching is one import::

    from fastensor.torch import load_file, save_file

In memory, :func:`save` and :func:`load` give and take the bytes of a safetensors file, as
``safetensors.torch.save``/``load`` do; :func:`save_model` and :func:`load_model` handle
shared (tied) tensors as ``safetensors.torch`` does.

Memory ownership: each tensor returned by :func:`load_file`, :func:`load_selected` and
``safe_open(...).get_tensor`` (on the CPU) has a storage of its own over memory the native
side laid out and filled with the GIL released (or the file mapped, see :func:`load_file`);
that memory is freed when the last tensor of the same read dies. Tensors of :func:`load`
and of loads to a GPU are allocated by torch. :func:`load_into` writes into the caller's
existing tensors. The save functions
read the caller's tensors in place (contiguous ones without a copy) while they run;
:func:`save_file_async` copies them first, so the caller may change them at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping

import torch

from . import _bytes, _native
from ._allocator import allocator_stats, caching_allocator, empty_cache, release_freed_memory
from ._checksum import load_torch_verified, open_file
from ._common import PathLike, check_metadata, fspath, is_sharded
from ._engine import Engine, engine_or_default
from ._model import _remove_duplicate_names as _remove_duplicate_names  # (safetensors.torch)
from ._model import load_model, save_model
from ._offload_block import offload
from ._safe_open import SafeOpenBase
from ._sharded import load_sharded, open_sharded, save_sharded
from ._torch_dtypes import TO_NAME as _TO_NAME  # noqa: F401 (the name other modules read)
from ._torch_dtypes import torch_shape
from ._torch_io import (
    LoadResult,
    _load_new,
    _on_cpu,
    _read_new,
    _save_specs,
    _torch_dtype,
    load_into,
    save_file,
    save_file_async,
)
from ._torch_shared import _end_ptr as _end_ptr  # (`x as x`: safetensors.torch's helpers)
from ._torch_shared import _find_shared_tensors as _find_shared_tensors
from ._torch_shared import _is_complete as _is_complete
from ._torch_shared import storage_ptr as storage_ptr
from ._torch_shared import storage_size as storage_size
from .errors import _invalid

__all__ = [
    "LoadResult",
    "allocator_stats",
    "caching_allocator",
    "empty_cache",
    "is_sharded",
    "load_sharded",
    "open_sharded",
    "save_sharded",
    "load",
    "load_file",
    "load_into",
    "load_model",
    "load_selected",
    "offload",
    "release_freed_memory",
    "safe_open",
    "save",
    "save_file",
    "save_file_async",
    "save_model",
]


def load_file(
    filename: PathLike,
    device: str | int | torch.device = "cpu",
    *,
    engine: Engine | None = None,
    verify: bool = False,
    process_group=None,
    group_read: str | None = None,
) -> dict[str, torch.Tensor]:
    """Loads every tensor of the safetensors file ``filename`` onto ``device``.

    The load is one job. To the CPU, the engine maps the file copy-on-write and brings its
    pages in on several threads before returning (unless the engine was made with
    ``mapped_loads=False`` or a pinned backend: then it reads the file into new memory).
    Each tensor has a storage of its own (``torch.save`` of one tensor saves its bytes
    only); the memory is released when the last tensor of the load dies. A mapped tensor
    is this process's to write (writes never reach the file); renaming or removing the file
    changes nothing, and the load holds a read lease on the file: a program that opens it
    for writing or truncates it (``cp`` over it, ``torch.save`` to its path) waits until
    the tensors' pages are moved into memory of this process, so they keep their bytes.
    Where no lease can be had (another process has the file open for writing, a file
    system without leases, another user's file) the file is read into new memory instead,
    unless the engine was made with ``unprotected_maps=True``. To a
    GPU, the bytes go straight to device memory where a backend takes it, else through
    host memory. Files written by other tools load too. With ``verify``, each tensor is
    read into new host memory and checked against the checksum saved with it
    (``save_file(..., checksum=True)``) as its bytes arrive.

    With ``process_group`` (a ``torch.distributed`` process group, e.g.
    ``torch.distributed.group.WORLD``), every rank of the group calls this with the same
    file and gets every tensor, bit for bit what one process loads, while each byte is read
    from storage once: each rank reads a share and the group's collectives (gloo on the
    CPU, NCCL on GPUs) broadcast it, reads and broadcasts overlapping. Where every rank
    reading is as cheap (ranks of one host reading a local file share the page cache) they
    each read; elsewhere the engine learns which way is faster from the loads' times.
    ``group_read`` (or ``$FASTENSOR_GROUP_READ``) forces ``"broadcast"`` or ``"each"``.
    Ranks given different checkpoints, or a rank that fails, make every rank raise.

    Raises:
        FileNotFoundError (NotFoundError): no such file.
        ValueError (CorruptError): not a valid safetensors file, or truncated, or (with
            ``verify``) a tensor whose checksum does not match; the message names the file
            and the tensor.
        RuntimeError (GroupError): with ``process_group``, another rank died or the group's
            collectives failed or timed out.
    """
    path = fspath(filename)
    native = engine_or_default(engine)
    if isinstance(device, int):
        device = f"cuda:{device}"

    def alone() -> dict[str, torch.Tensor]:
        if verify and not _on_cpu(device):
            return load_torch_verified(native, path, device)
        return _load_new(native, path, None, device, verify)

    if process_group is None:
        return alone()
    from . import _group

    return _group.load_new(
        native,
        process_group,
        path,
        lambda: open_file(native, path, verify),
        device,
        verify,
        group_read,
        alone,
    )


def load_selected(
    filename: PathLike,
    names: Iterable[str],
    device: str | int | torch.device = "cpu",
    *,
    engine: Engine | None = None,
) -> dict[str, torch.Tensor]:
    """Loads only the tensors ``names`` of ``filename``; only their bytes are read.

    Raises:
        FileNotFoundError (NotFoundError): no such file, or a name the file lacks.
    """
    path = fspath(filename)
    engine = engine_or_default(engine)
    if isinstance(device, int):
        device = f"cuda:{device}"
    return _load_new(engine, path, list(dict.fromkeys(names)), device)


class safe_open(SafeOpenBase):  # noqa: N801 (named as in safetensors)
    """Opens a safetensors file for reads on demand, as ``safetensors.safe_open`` does::

    with safe_open("model.safetensors", framework="pt") as f:
        names = f.keys()
        w = f.get_tensor("w")
    """

    _framework = "pt"

    def __init__(
        self,
        filename: PathLike,
        framework: str = "pt",
        device: str | int | torch.device = "cpu",
        *,
        engine: Engine | None = None,
        verify: bool = False,
        process_group=None,
        group_read: str | None = None,
    ):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError(f"fastensor.torch.safe_open: framework {framework!r} is not 'pt'")
        path = fspath(filename)
        self._engine = engine_or_default(engine)
        self._device = f"cuda:{device}" if isinstance(device, int) else device
        self._verify = verify
        self._group = None
        if process_group is None:
            super().__init__(open_file(self._engine, path, verify), path)
            return
        from . import _group

        def opener():
            return open_file(self._engine, path, verify)

        dev = self._device
        self._group = _group.open_group(self._engine, process_group, path, opener, dev, group_read)[
            0
        ]
        super().__init__(self._group.file, path)

    def _read(self, entries) -> dict[str, torch.Tensor]:
        if self._group is None:
            return self._read_alone(entries)
        from . import _group

        self._open_file()
        alone = lambda: self._read_alone(entries)  # noqa: E731
        return _group.read_entries(self._group, entries, self._device, self._verify, alone)

    def _read_alone(self, entries) -> dict[str, torch.Tensor]:
        device = "cpu" if self._verify else self._device  # (checksums: host memory)
        out = _read_new(self._open_file(), self._path, entries, device, self._engine)
        return out if device == self._device else {k: v.to(self._device) for k, v in out.items()}

    def get_sharded(self, name: str, dim: int = 0) -> torch.Tensor:
        """This rank's part of tensor ``name`` along ``dim``, for a file opened with
        ``process_group``: ``torch.chunk(tensor, world_size, dim)[rank]`` (an empty part
        along ``dim`` where ``torch.chunk`` gives fewer parts than ranks), read from storage
        by this rank alone (only its bytes; no collective), as fastsafetensors'
        ``get_sharded`` gives it.

        Raises:
            ValueError (InvalidInputError): the file was opened without ``process_group``,
                or ``dim`` is out of range.
        """
        if self._group is None:
            raise _invalid(
                f"{self._path}: get_sharded needs a file opened with process_group=", self._path
            )
        entry = self._entry(name)
        shape = list(torch_shape(entry[1], entry[2]))
        nd = len(shape)
        d = dim + nd if dim < 0 else dim
        if not 0 <= d < nd:
            raise _invalid(
                f"{self._path}: tensor `{name}` has {nd} dimensions; cannot split along {dim}",
                self._path,
            )
        n, ranks, rank = shape[d], self._group.group.size, self._group.group.rank
        step = -(-n // ranks)
        start = min(rank * step, n)
        stop = min(start + step, n)
        return self.get_slice(name)[(slice(None),) * d + (slice(start, stop),)]


def _target_device(device: str | int | torch.device) -> torch.device:
    return torch.device(f"cuda:{device}" if isinstance(device, int) else device)


def save(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors``, as ``safetensors.torch.save``
    gives them (the same layout, byte for byte: readable by ``safetensors.torch.load`` and
    :func:`load`).

    Tensors may be non-contiguous (saved as their contiguous copy) and on the CPU or a CUDA
    device. ``metadata`` is a dict of str to str.

    Raises:
        TypeError: a name, tensor or metadata value of the wrong type.
        ValueError (InvalidInputError): a dtype safetensors cannot hold, a sparse tensor.
    """
    where = _bytes.WHERE
    meta = check_metadata(metadata, where)
    specs = _save_specs(tensors, where, None, host_only=True)
    return _native.serialize(specs, meta)


def load(data: bytes, device: str | int | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of ``data``, the bytes of a safetensors file (as ``safetensors.torch.load``
    reads them), on ``device``.

    ``data`` is checked before anything is allocated: each tensor owns memory of its own
    size, and no more than ``data`` holds is allocated in all.

    Raises:
        ValueError (CorruptError): ``data`` is not valid safetensors (the header length,
            the JSON, offsets out of range, overlapping or leaving gaps, a shape that does
            not match its bytes): the message names the problem and the tensor.
        ValueError (InvalidInputError): a dtype this torch lacks.
    """
    body, entries, _ = _bytes.parse(data)
    dev = _target_device(device)
    out: dict[str, torch.Tensor] = {}
    for e in entries:
        dt = _torch_dtype(_bytes.WHERE, e.name, e.dtype)
        shape = torch_shape(e.dtype, e.shape)
        if e.end == e.start:
            t = torch.empty(shape, dtype=dt)
        else:
            with warnings.catch_warnings():  # (read-only buffer: the bytes are copied)
                warnings.simplefilter("ignore")
                raw = torch.frombuffer(
                    body, dtype=torch.uint8, offset=e.start, count=e.end - e.start
                )
            t = raw.clone().view(dt).reshape(shape)
        out[e.name] = t if dev.type == "cpu" else t.to(dev)
    return out
