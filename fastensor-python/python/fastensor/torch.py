"""Safetensors checkpoints for PyTorch, moved by fastensor's engine.

The names follow ``safetensors.torch``, so switching is one import::

    from fastensor.torch import load_file, save_file

In memory, :func:`save` and :func:`load` give and take the bytes of a safetensors file, as
``safetensors.torch.save``/``load`` do; :func:`save_model` and :func:`load_model` handle
shared (tied) tensors as ``safetensors.torch`` does.

Memory ownership: tensors returned by :func:`load_file`, :func:`load`, :func:`load_selected` and
``safe_open(...).get_tensor`` are allocated by torch (its allocator owns them; each tensor
has its own storage, freed with it) and filled in place by the engine with the GIL
released. :func:`load_into` writes into the caller's existing tensors. The save functions
read the caller's tensors in place (contiguous ones without a copy) while they run;
:func:`save_file_async` copies them first, so the caller may change them at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import torch

from . import _bytes, _native
from ._allocator import allocator_stats, caching_allocator, empty_cache
from ._checksum import load_torch_verified, open_file
from ._common import (
    IO_ALIGN,
    PathLike,
    allocation_error,
    check_metadata,
    fspath,
    pad_for,
    read_new,
    unknown_dtype,
)
from ._engine import Engine, engine_or_default, watch_pending_saves
from ._host_load import load_host, read_host
from ._model import _end_ptr as _end_ptr  # (`x as x`: safetensors.torch's helpers)
from ._model import _find_shared_tensors as _find_shared_tensors
from ._model import _is_complete as _is_complete
from ._model import _remove_duplicate_names as _remove_duplicate_names
from ._model import load_model, save_model
from ._model import storage_ptr as storage_ptr
from ._model import storage_size as storage_size
from ._offload import offload, release_freed_memory
from ._safe_open import SafeOpenBase
from ._sharded import _open_any, is_sharded, load_sharded, open_sharded, save_sharded
from ._torch_checks import check_savable
from ._torch_dtypes import FROM_NAME as _FROM_NAME
from ._torch_dtypes import TO_NAME as _TO_NAME
from ._torch_dtypes import header_shape, torch_shape
from ._torch_hold import held
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


class LoadResult(NamedTuple):
    """What :func:`load_into` did not match, as ``nn.Module.load_state_dict`` reports it."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _device_ordinal(t: torch.Tensor) -> int:
    if t.device.type == "cpu":
        return -1
    if t.device.type == "cuda":
        return t.device.index if t.device.index is not None else torch.cuda.current_device()
    raise _invalid(f"tensors on {t.device} are not supported (only cpu and cuda)")


def _takes_device_memory(engine: _native.Engine) -> bool:
    """Whether ``engine`` moves device memory itself (a backend's capabilities say so)."""
    return engine.takes_device_memory()


def _warn_staged_once(what: str) -> None:
    if not getattr(_warn_staged_once, "done", False):
        _warn_staged_once.done = True
        warnings.warn(
            f"fastensor: no CUDA backend is available here; {what} go through host memory",
            stacklevel=3,
        )


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` (made contiguous if needed) as a flat ``uint8`` tensor over the
    same memory: what the native module lends (DLPack knows every dtype as bytes)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def _save_specs(tensors: Mapping[str, torch.Tensor], path: str, engine, host_only: bool):
    """The save specs ``(name, dtype, shape, bytes)`` of ``tensors``."""
    check_savable(tensors, path)
    specs = []
    device_ok = not host_only and _takes_device_memory(engine)
    synced = set()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{path}: `{name}` is a {type(t).__name__}, not a torch.Tensor")
        if t.is_nested:
            raise _invalid(f"{path}: tensor `{name}` is a nested tensor; only dense tensors", path)
        if t.layout != torch.strided:
            raise _invalid(
                f"{path}: tensor `{name}` has layout {t.layout}; only dense tensors", path
            )
        if t.device.type not in ("cpu", "cuda"):
            raise _invalid(
                f"{path}: tensor `{name}` is on {t.device}; only cpu and cuda tensors have"
                " data to save",
                path,
            )
        dtype = _TO_NAME.get(t.dtype)
        if dtype is None:
            raise _invalid(
                f"{path}: tensor `{name}` has dtype {t.dtype}, which safetensors cannot hold", path
            )
        t = t.detach()
        ordinal = _device_ordinal(t)
        if ordinal >= 0 and not device_ok:
            if not host_only:
                _warn_staged_once("saves of CUDA tensors")
            t, ordinal = t.to("cpu"), -1
        elif ordinal >= 0 and ordinal not in synced:
            torch.cuda.synchronize(ordinal)  # pending kernels may still write the tensor
            synced.add(ordinal)
        raw = held(_bytes_of(t), path, f"tensor `{name}`")
        specs.append((name, dtype, header_shape(t, dtype, path, name), raw))
    return specs


def save_file(
    tensors: Mapping[str, torch.Tensor],
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    engine: Engine | None = None,
    checksum: bool = False,
) -> None:
    """Saves ``tensors`` to ``filename`` as a safetensors file.

    The file is written durably and atomically: to a temporary file in the same directory,
    synced, then renamed over ``filename``; after a crash ``filename`` holds the old file or
    the new one, whole. Tensors may be non-contiguous (saved as their contiguous copy) and
    on the CPU or a CUDA device. ``metadata`` is a dict of str to str. With ``checksum``,
    the CRC-32C of each tensor is stored in the metadata (``"fastensor.checksums"``) for
    ``verify=True`` loads and ``fastensor ckpt verify``; the file stays plain safetensors.

    Raises:
        TypeError: a name, tensor or metadata value of the wrong type.
        ValueError (InvalidInputError): a dtype safetensors cannot hold, a sparse tensor.
        OSError (FastensorError subclasses): the file could not be written; nothing of it
            is left behind.
    """
    path = fspath(filename)
    engine = engine_or_default(engine)
    meta = check_metadata(metadata, path)
    specs = _save_specs(tensors, path, engine, host_only=checksum)
    engine.save(path, specs, meta, checksum=checksum)


def save_file_async(
    tensors: Mapping[str, torch.Tensor],
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    engine: Engine | None = None,
    checksum: bool = False,
) -> _native.SaveHandle:
    """Snapshots ``tensors`` and saves them to ``filename`` in the background.

    Returns once the tensors' bytes are copied to host staging memory (CUDA tensors are
    copied to the host first), so the caller may change them at once. The save itself is
    durable and atomic as :func:`save_file`'s. The returned handle's ``wait()`` blocks until
    the file is saved and raises its error, if any; ``done()`` polls. The staging memory is
    kept by the engine for the next snapshot (``engine.release_staging()`` frees it).
    ``checksum`` as :func:`save_file`'s (computed before this returns).
    """
    path = fspath(filename)
    engine = engine_or_default(engine)
    meta = check_metadata(metadata, path)
    watch_pending_saves()
    specs = _save_specs(tensors, path, engine, host_only=True)
    return engine.save_async(path, specs, meta, checksum=checksum)


def _torch_dtype(path: str, name: str, dtype: str) -> torch.dtype:
    dt = _FROM_NAME.get(dtype)
    if dt is None:
        raise unknown_dtype(path, name, dtype, f"torch {torch.__version__}")
    return dt


def _place_new(entry, path: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A new tensor for ``entry`` in device memory, placed for a direct read (see
    ``pad_for``): the tensor, the ``uint8`` tensor whose memory holds it, and its byte
    offset there (torch's errors unwrapped: see :func:`_empty_for`)."""
    name, dtype, shape, offset, nbytes = entry
    dt = _torch_dtype(path, name, dtype)
    shape = torch_shape(dtype, shape)
    if nbytes == 0:
        t = torch.empty(shape, dtype=dt, device=device)
        return t, t, 0
    raw = torch.empty(nbytes + IO_ALIGN, dtype=torch.uint8, device=device)
    pad = pad_for(offset, raw.data_ptr(), nbytes, dt.itemsize)
    return raw[pad : pad + nbytes].view(dt).view(shape), raw, pad


def _empty_for(entry, path: str, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """:func:`_place_new`, with torch's errors as fastensor errors naming the file and the
    tensor: a shape torch cannot hold, memory that cannot be allocated."""
    try:
        return _place_new(entry, path, device)
    except (RuntimeError, ValueError, MemoryError) as exc:
        oom = isinstance(exc, torch.cuda.OutOfMemoryError)
        raise allocation_error(path, entry, exc, "torch", out_of_memory=oom) from exc


def _on_cpu(device: str | torch.device) -> bool:
    return torch.device(device).type == "cpu"


def _load_new(
    engine,
    path: str,
    names: list[str] | None,
    device: str | torch.device,
    verify: bool = False,
) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` (all, or ``names``) on ``device``, as one job: into host
    memory through one native call (see ``_host_load``), to a GPU directly where a backend
    takes device memory, else through host memory."""
    dev = torch.device(device)
    if dev.type == "cpu":
        return load_host(engine, path, names, verify)
    if dev.type == "cuda" and not _takes_device_memory(engine):
        _warn_staged_once("loads to CUDA")
        host = load_host(engine, path, names, verify)
        return {k: v.to(dev) for k, v in host.items()}
    file = engine.open(path)
    entries = file.entries()
    if names is not None:
        by_name = {e[0]: e for e in entries}
        entries = [by_name[n] for n in names]
    return _read_new(file, path, entries, dev, engine)


def _read_new(
    file, path: str, entries, device: str | torch.device, engine
) -> dict[str, torch.Tensor]:
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise _invalid(f"{path}: cannot load to device {dev} (only cpu and cuda)", path)
    if dev.type == "cpu":
        return read_host(file, path, [e[0] for e in entries])
    if not _takes_device_memory(engine):
        _warn_staged_once("loads to CUDA")
        host = read_host(file, path, [e[0] for e in entries])
        return {k: v.to(dev) for k, v in host.items()}
    return read_new(file, entries, lambda e: _empty_for(e, path, dev))


def load_file(
    filename: PathLike,
    device: str | int | torch.device = "cpu",
    *,
    engine: Engine | None = None,
    verify: bool = False,
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

    Raises:
        FileNotFoundError (NotFoundError): no such file.
        ValueError (CorruptError): not a valid safetensors file, or truncated, or (with
            ``verify``) a tensor whose checksum does not match; the message names the file
            and the tensor.
    """
    path = fspath(filename)
    engine = engine_or_default(engine)
    if isinstance(device, int):
        device = f"cuda:{device}"
    if verify and not _on_cpu(device):
        return load_torch_verified(engine, path, device)
    return _load_new(engine, path, None, device, verify)


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


def _state_of(target) -> dict[str, torch.Tensor]:
    if isinstance(target, torch.nn.Module):
        return target.state_dict()
    if isinstance(target, Mapping):
        for k, v in target.items():
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"load_into: `{k}` is a {type(v).__name__}, not a torch.Tensor")
        return dict(target)
    raise TypeError(
        f"load_into: expected an nn.Module or a dict of tensors, got {type(target).__name__}"
    )


def load_into(
    target: torch.nn.Module | Mapping[str, torch.Tensor],
    filename: PathLike,
    strict: bool = True,
    *,
    engine: Engine | None = None,
    verify: bool = False,
) -> LoadResult:
    """Reads the tensors of ``filename`` straight into ``target``'s existing tensors.

    ``filename`` is a safetensors file, or a sharded checkpoint: its directory or its
    ``*.safetensors.index.json`` (see :func:`save_sharded`), whose shards are read as one job.

    ``target`` is an ``nn.Module`` (its ``state_dict()``: parameters and persistent
    buffers) or a dict of tensors. Contiguous destinations of the file's dtype are filled in
    place with no copy; others (another dtype, non-contiguous) are read and then copied in,
    as ``load_state_dict`` does. Returns the missing and unexpected names; with ``strict``
    (the default) any of either, or a shape that differs, raises before anything is read.
    With ``verify``, each tensor is checked against the checksum saved with it as it is
    read (CUDA destinations are then filled through host memory).

    Raises:
        RuntimeError: with ``strict``, names that do not match (listed as
            ``load_state_dict`` lists them); or any shape mismatch.
        ValueError (CorruptError): with ``verify``, a tensor whose checksum does not match
            (its destination's contents are then unspecified).
        OSError (FileChangedError): the file was replaced (renamed over) after it was
            opened (opening it is retried natively), before its reads.
    """
    path = fspath(filename)
    engine = engine_or_default(engine)
    state = _state_of(target)
    # A directory or an index: every shard, as one job; ``verify``: each tensor checked.
    file = _open_any(engine, path, verify)
    entries = {e[0]: e for e in file.entries()}
    missing = [k for k in state if k not in entries]
    unexpected = [k for k in entries if k not in state]
    what = type(target).__name__
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(
                "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + "."
            )
        if unexpected:
            parts.append(
                "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + "."
            )
        raise RuntimeError(
            f"Error(s) in loading state_dict for {what} from {path}:\n\t" + "\n\t".join(parts)
        )
    direct, staged = [], []
    seen: dict[tuple, str] = {}
    errors = []
    for name, dst in state.items():
        e = entries.get(name)
        if e is None:
            continue
        _, dtype, shape, _, nbytes = e
        if tuple(dst.shape) != tuple(torch_shape(dtype, shape)):
            errors.append(
                f"size mismatch for {name}: copying a param with shape {torch.Size(shape)} from "
                f"checkpoint, the shape in current model is {dst.shape}."
            )
            continue
        same = _TO_NAME.get(dst.dtype) == dtype and dst.is_contiguous()
        if same and dst.layout == torch.strided and nbytes:
            key = (dst.device, dst.data_ptr(), nbytes)
            if key in seen:  # tied weights: one read fills both names
                continue
            seen[key] = name
            direct.append((name, dst))
        elif nbytes:
            staged.append((name, dst))
    if errors:
        raise RuntimeError(
            f"Error(s) in loading state_dict for {what} from {path}:\n\t" + "\n\t".join(errors)
        )
    cuda_direct = _takes_device_memory(engine) and not verify  # (checked in host memory)
    targets, copies = [], []
    for name, dst in direct:
        if dst.device.type == "cuda" and not cuda_direct:
            staged.append((name, dst))
            continue
        targets.append((name, _bytes_of(dst), 0, entries[name][4]))
    synced = {_device_ordinal(dst) for _, dst in direct if dst.device.type == "cuda"}
    for d in synced:
        torch.cuda.synchronize(d)  # nothing may still be using the destinations
    if staged:
        fresh = _read_new(file, path, [entries[n] for n, _ in staged], "cpu", engine)
        copies = [(dst, fresh[n]) for n, dst in staged]
    file.read_into(targets)
    with torch.no_grad():
        for dst, src in copies:
            dst.copy_(src)
    return LoadResult(missing, unexpected)


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
    ):
        if framework not in ("pt", "torch", "pytorch"):
            raise ValueError(f"fastensor.torch.safe_open: framework {framework!r} is not 'pt'")
        path = fspath(filename)
        self._engine = engine_or_default(engine)
        self._device = f"cuda:{device}" if isinstance(device, int) else device
        self._verify = verify
        super().__init__(open_file(self._engine, path, verify), path)

    def _read(self, entries) -> dict[str, torch.Tensor]:
        device = "cpu" if self._verify else self._device  # (checksums: host memory)
        out = _read_new(self._open_file(), self._path, entries, device, self._engine)
        return out if device == self._device else {k: v.to(self._device) for k, v in out.items()}


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
