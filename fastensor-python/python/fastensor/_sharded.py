"""Sharded checkpoints in the Hugging Face layout, for PyTorch (exported by
:mod:`fastensor.torch`).

A sharded checkpoint is a directory of ``model-00001-of-00003.safetensors``, ... and
``model.safetensors.index.json``, whose ``weight_map`` names each tensor's shard and whose
``metadata.total_size`` counts the data bytes (what ``transformers``' ``save_pretrained``
writes and ``from_pretrained`` reads). The shards are written concurrently, each durably and
atomically, and the index last, atomically; loads read every shard as one job, the requests
of all files in flight together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from . import _checksum, _native
from ._common import PathLike, check_metadata, fspath, is_sharded
from ._engine import Engine, engine_or_default
from ._host_load import load_host, load_host_later, read_host
from ._torch_io import _read_new, _save_specs

__all__ = [
    "is_sharded",
    "load_sharded",
    "open_sharded",
    "save_sharded",
]


def parse_size(size: int | str) -> int:
    """Bytes of ``size``: an int, or a string such as ``"5GB"`` (10^9) or ``"500MiB"``
    (2^20), as ``transformers``' ``max_shard_size`` takes it; strings are read by the native
    size parser, the one every size of fastensor goes through."""
    if isinstance(size, bool):
        raise TypeError("max_shard_size must be an int or a size string")
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size must be positive, got {size}")
        return size
    try:
        n = _native.parse_size(str(size))
    except ValueError as exc:
        raise ValueError(
            f"cannot read {size!r} as a size (e.g. '5GB', '500MiB', 1000000): {exc}"
        ) from None
    if n <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return n


def open_sharded(path: PathLike, *, engine: Engine | None = None) -> _native.ShardedFile:
    """Opens the sharded checkpoint at ``path`` (its directory or its index): the index and
    every shard's header are validated; nothing else is read.

    Raises:
        FileNotFoundError: no index in the directory, or a shard it names is missing.
        ValueError (CorruptError): a bad index, or a shard lacking a tensor the index puts
            there.
    """
    return _native.open_sharded(engine_or_default(engine), fspath(path))


def save_sharded(
    tensors: Mapping[str, torch.Tensor],
    save_directory: PathLike,
    max_shard_size: int | str = "5GB",
    metadata: Mapping[str, str] | None = None,
    *,
    engine: Engine | None = None,
    checksum: bool = False,
) -> dict[str, str]:
    """Saves ``tensors`` as a sharded checkpoint in ``save_directory``.

    The tensors are split, in order, into shards of at most ``max_shard_size`` bytes (an int,
    or ``"5GB"``-style; a tensor larger than that gets a shard of its own), named
    ``model-0000K-of-0000N.safetensors`` and written concurrently, each durably and
    atomically; then ``model.safetensors.index.json`` is written atomically. An index already
    there is removed first, so a crash never leaves an index naming missing, partial or
    mixed shards; shards of an earlier save that the new index does not name are removed.
    Under an object prefix (``s3://bucket/model``) the index object is the commit point:
    the shards' names carry a tag of the save (``model-0000K-of-0000N-TAG.safetensors``, named
    by the index), the index replaces the previous one once every shard is complete, and the
    previous save's shards are deleted after it, so a load gives the previous checkpoint or
    the new one, never a mix.
    Every shard carries ``metadata`` (default ``{"format": "pt"}``, which ``transformers``
    expects). With ``checksum``, each shard also stores the CRC-32C of each of its tensors
    (see :func:`fastensor.torch.save_file`). Returns the weight map (tensor name -> shard
    file name).
    """
    path = fspath(save_directory)
    engine = engine_or_default(engine)
    meta = check_metadata(metadata, path) if metadata is not None else {"format": "pt"}
    limit = parse_size(max_shard_size)
    specs = _save_specs(tensors, path, engine, host_only=checksum)
    if checksum:
        meta = _checksum.stamp(specs, meta)  # (split per shard by the native save)
    return _native.save_sharded(engine, path, specs, limit, meta)


def _load_host_by_shard(engine, file, names: Iterable[str] | None) -> dict[str, torch.Tensor]:
    """Every tensor (or ``names``, in their order) into new host memory, one load per shard
    (each mapped and brought in as ``load_file`` does, by all the I/O threads)."""
    wanted = None if names is None else set(names)
    out: dict[str, torch.Tensor] = {}
    for shard, in_shard in file.names_by_shard():
        take = in_shard if wanted is None else [n for n in in_shard if n in wanted]
        if take:
            out.update(load_host(engine, fspath(shard), take))
    if names is None:
        return out
    return {n: out[n] for n in dict.fromkeys(names)}


def load_host_later_by_shard(engine, path: str) -> tuple[dict[str, torch.Tensor], list]:
    """Every tensor of the sharded checkpoint at ``path`` in new host memory, returned as
    soon as each shard is mapped (see :func:`fastensor._host_load.load_host_later`): the
    tensors, and the ``PendingPages`` of each shard, whose pages are coming in."""
    file = _native.open_sharded(engine, path, False)
    out: dict[str, torch.Tensor] = {}
    pending = []
    for shard, in_shard in file.names_by_shard():
        if in_shard:
            tensors, pages = load_host_later(engine, fspath(shard), in_shard)
            out.update(tensors)
            if pages is not None:
                pending.append(pages)
    return out, pending


def load_sharded(
    path: PathLike,
    device: str | int | torch.device = "cpu",
    names: Iterable[str] | None = None,
    *,
    engine: Engine | None = None,
    verify: bool = False,
    process_group=None,
    group_read: str | None = None,
) -> dict[str, torch.Tensor]:
    """Loads the sharded checkpoint at ``path`` (its directory or its index) onto
    ``device``: every tensor, or only ``names`` (only their bytes are read). On the CPU each
    shard is loaded as ``load_file`` loads a file (mapped copy-on-write, brought in before
    this returns, each tensor its own storage); to a GPU the reads of all shards go out
    together.

    With ``verify``, each tensor is checked against the checksum its shard stores
    (``save_sharded(..., checksum=True)``), in host memory.

    With ``process_group``, every rank of the group loads it together, each byte read
    from storage by one rank (see :func:`fastensor.torch.load_file`).

    Raises:
        FileNotFoundError (NotFoundError): no index, a missing shard, or a name the index
            lacks.
        ValueError (CorruptError): with ``verify``, a tensor whose checksum does not match.
    """
    p = fspath(path)
    if isinstance(device, int):
        device = f"cuda:{device}"
    if process_group is not None:
        from . import _group

        native = engine_or_default(engine)
        wanted = None if names is None else list(names)
        return _group.load_new(
            native,
            process_group,
            p,
            lambda: _native.open_sharded(native, p, verify),
            device,
            verify,
            group_read,
            lambda: load_sharded(p, device, wanted, engine=engine, verify=verify),
            wanted,
        )
    engine = engine_or_default(engine)
    file = _native.open_sharded(engine, p, verify)
    entries = file.entries()
    if names is not None:
        by_name = {e[0]: e for e in entries}
        wanted = []
        for n in dict.fromkeys(names):
            if n not in by_name:
                from .errors import NotFoundError

                exc = NotFoundError(f"{p}: no tensor `{n}` in the checkpoint")
                exc.path = p
                raise exc
            wanted.append(by_name[n])
        entries = wanted
    if torch.device(device).type == "cpu" and not verify:
        return _load_host_by_shard(engine, file, names)
    if torch.device(device).type == "cpu":
        return read_host(file, p, [e[0] for e in entries])
    if verify:  # (checked in host memory, then moved)
        host = read_host(file, p, [e[0] for e in entries])
        return {k: v.to(device) for k, v in host.items()}
    return _read_new(file, p, entries, device, engine)
