"""The torch front end's saves and loads of files, below :mod:`fastensor.torch` (which
exports them) and the modules built on them (``save_model``/``load_model``, sharded
checkpoints): save specs of tensors, new tensors read from an open file (host memory laid
out by the native side, device memory placed here for direct reads), and loads into
existing tensors."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import NamedTuple

import torch

from . import _native
from ._checksum import open_any
from ._common import (
    IO_ALIGN,
    PathLike,
    allocation_error,
    check_metadata,
    fspath,
    pad_for,
    read_new,
)
from ._engine import Engine, engine_or_default, watch_pending_saves
from ._host_load import load_host, read_host
from ._torch_checks import check_savable
from ._torch_dtypes import TO_NAME as _TO_NAME
from ._torch_dtypes import header_shape, torch_shape
from ._torch_dtypes import torch_dtype as _torch_dtype
from ._torch_hold import held
from .errors import _invalid


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
    device_ok = not host_only and engine.takes_device_memory(path)
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
    if dev.type == "cuda" and not engine.takes_device_memory(path):
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
    if not engine.takes_device_memory(path):
        _warn_staged_once("loads to CUDA")
        host = read_host(file, path, [e[0] for e in entries])
        return {k: v.to(dev) for k, v in host.items()}
    return read_new(file, entries, lambda e: _empty_for(e, path, dev))


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
    process_group=None,
    group_read: str | None = None,
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

    With ``process_group`` (a ``torch.distributed`` group; every rank calls this with the
    same checkpoint), each byte is read from storage by one rank and broadcast, or every
    rank reads, as the engine decides (``group_read``: ``"broadcast"``, ``"each"`` or
    ``"auto"``; see :func:`fastensor.torch.load_file`); a failure on any rank raises on
    every rank.

    Raises:
        RuntimeError: with ``strict``, names that do not match (listed as
            ``load_state_dict`` lists them); or any shape mismatch.
        ValueError (CorruptError): with ``verify``, a tensor whose checksum does not match
            (its destination's contents are then unspecified).
        OSError (FileChangedError): the file was replaced (renamed over) after it was
            opened (opening it is retried natively), before its reads.
    """
    path = fspath(filename)
    asked_engine = engine
    engine = engine_or_default(engine)
    state = _state_of(target)
    what = type(target).__name__
    if process_group is not None:
        from . import _group

        def match(file):
            return _match_state(state, file.entries(), path, what, strict)

        def each():
            return load_into(target, path, strict, engine=asked_engine, verify=verify)

        missing, unexpected = _group.load_into(
            engine,
            process_group,
            path,
            lambda: open_any(engine, path, verify),
            verify,
            group_read,
            match,
            each,
        )
        return LoadResult(missing, unexpected)
    # A directory or an index: every shard, as one job; ``verify``: each tensor checked.
    file = open_any(engine, path, verify)
    entries = {e[0]: e for e in file.entries()}
    missing, unexpected, pairs = _match_state(state, file.entries(), path, what, strict)
    direct, staged = [], []
    seen: dict[tuple, str] = {}
    for name, dst in pairs:
        _, dtype, _, _, nbytes = entries[name]
        same = _TO_NAME.get(dst.dtype) == dtype and dst.is_contiguous()
        if same and dst.layout == torch.strided:
            key = (dst.device, dst.data_ptr(), nbytes)
            if key in seen:  # tied weights: one read fills both names
                continue
            seen[key] = name
            direct.append((name, dst))
        else:
            staged.append((name, dst))
    cuda_direct = engine.takes_device_memory(path) and not verify  # (checked in host memory)
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


def _match_state(
    state: dict[str, torch.Tensor], rows, path: str, what: str, strict: bool
) -> tuple[list[str], list[str], list[tuple[str, torch.Tensor]]]:
    """``state`` matched against the checkpoint's entries ``rows``, as ``load_state_dict``
    matches: the missing and unexpected names and the ``(name, destination)`` pairs with
    bytes to fill. Raises ``RuntimeError`` (listing them as ``load_state_dict`` does) for
    names that do not match when ``strict``, and for any shape that differs."""
    entries = {e[0]: e for e in rows}
    missing = [k for k in state if k not in entries]
    unexpected = [k for k in entries if k not in state]
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
    pairs, errors = [], []
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
        if nbytes:
            pairs.append((name, dst))
    if errors:
        raise RuntimeError(
            f"Error(s) in loading state_dict for {what} from {path}:\n\t" + "\n\t".join(errors)
        )
    return missing, unexpected, pairs
