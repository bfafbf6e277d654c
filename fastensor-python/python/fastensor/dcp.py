"""A ``torch.distributed.checkpoint`` (DCP) storage layer that moves bytes through fastensor.

torch.distributed runs the processes, plans the checkpoint and reshards it; fastensor only
stores and loads the bytes::

    import torch.distributed.checkpoint as dcp
    from fastensor.dcp import Reader, Writer

    dcp.save(state_dict, storage_writer=Writer("ckpt/step-100"))
    future = dcp.async_save(state_dict, storage_writer=Writer("ckpt/step-200"))
    dcp.load(state_dict, storage_reader=Reader("ckpt/step-200"))

Layout of a checkpoint directory:

* one data file per rank and save, ``__{rank}_{save_id}.safetensors``: a valid safetensors
  file whose tensors are the rank's write items as raw bytes (``U8``), written by fastensor's
  aligned, parallel writer, durably and atomically (temporary file, sync, rename,
  directory sync). Nothing is pickled but the small ``BYTE_IO`` items DCP itself serialises.
* ``.fastensor_metadata``: DCP's ``Metadata`` (pickled, as ``FileSystemWriter`` writes its
  ``.metadata``), written by the coordinator last, once every rank's data is durable, and
  atomically. A save that fails on any rank writes no metadata, so the previous checkpoint
  in the directory stays the one that loads (its data files are never overwritten: each
  save's files carry the save's id). Data files that the new metadata does not name (left by
  earlier or failed saves) are removed after it is written.
* ``.fastensor_metadata.rank{N}``: rank ``N``'s own metadata, written instead by a save without
  rank coordination (``dcp.save(..., use_collectives=False)``), where every rank plans and
  finishes alone. Such a checkpoint loads rank by rank: ``dcp.load`` falls back to each
  rank's own metadata when the directory holds no global one (torch's behaviour), so each
  rank gets back what it saved. A rank's save removes the global metadata (which would
  otherwise be loaded instead) and its own earlier data files, and no other rank's; a
  coordinated save removes every rank's metadata it supersedes.

Reads are ranged: each read item reads only the bytes of the slice it needs (rows of the
saved chunk), straight into the destination tensor where that tensor is a contiguous CPU
tensor of the saved dtype (a copy otherwise); the reads of every file go out in one native
call, small neighbours merged, all files in flight together.

A checkpoint id may be an object prefix, ``s3://bucket/ckpt/step-100``: the same layout,
each data file an object uploaded in parallel parts that appears only once complete, the
metadata object written last, superseded objects deleted after it, and reads ranged GETs
(credentials and endpoint from the environment, as for :func:`fastensor.torch.load_file`).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import pickle
import re
import uuid
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _native
from ._common import PathLike, fspath
from ._engine import Engine, engine_or_default
from ._torch_hold import held

__all__ = ["METADATA_NAME", "Reader", "StorageInfo", "Writer"]

#: The name of the checkpoint's metadata file in its directory.
METADATA_NAME = ".fastensor_metadata"

_DATA_FILE = re.compile(r"__\d+_[0-9a-f]{32}\.safetensors")

#: A rank's own metadata file (a save without rank coordination).
_RANK_METADATA = re.compile(re.escape(METADATA_NAME) + r"\.rank\d+")


def _rank_metadata_name(rank: int) -> str:
    """The name of rank ``rank``'s own metadata file."""
    return f"{METADATA_NAME}.rank{rank}"


#: Bytes of temporary buffers (slices that cannot be read in place) gathered before their
#: reads go out; bounds the extra memory of a resharding load.
_PENDING_MAX = 256 << 20


@dataclasses.dataclass(frozen=True)
class StorageInfo:
    """Where a write item's bytes are: a data file of the checkpoint and a byte range."""

    relative_path: str
    offset: int
    length: int


def _sync_dir(path: str) -> None:
    """Makes the entries of directory ``path`` (names added or removed) durable; an object
    prefix has nothing to sync."""
    if not _native.has_directories(path):
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` as a contiguous 1-D ``uint8`` CPU tensor (no copy when ``t`` is a
    contiguous CPU tensor)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    return t.view(torch.uint8)


class Writer(StorageWriter, BlockingAsyncStager):
    """A DCP ``StorageWriter`` that writes each rank's items through fastensor.

    Args:
        path: the checkpoint directory (created if needed), or an object prefix
            (``s3://bucket/prefix``).
        engine: the fastensor engine to use (default: the shared default engine).
        cache_staged_state_dict: for ``dcp.async_save``: keep the CPU copy that staging
            makes and reuse it on the next save of a state dict of the same structure (no
            fresh memory to fault in), at the cost of that memory held between saves.
        checksum: store the CRC-32C of each item in its data file's metadata (see
            :func:`fastensor.torch.save_file`), checked by ``fastensor ckpt verify`` and
            :func:`fastensor.verify_file` on each data file.
    """

    def __init__(
        self,
        path: PathLike,
        *,
        engine: Engine | None = None,
        cache_staged_state_dict: bool = False,
        checksum: bool = False,
    ) -> None:
        StorageWriter.__init__(self)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=False)
        self.path = fspath(path)
        self.engine = engine_or_default(engine)
        self.save_id = uuid.uuid4().hex
        self.rank: int | None = None
        self.is_coordinator = False
        self.use_collectives = True
        self._cache_staged = cache_staged_state_dict
        self._staged: dict[str, Any] | None = None
        self._checksum = checksum

    # -- StorageWriter --------------------------------------------------------------------

    def reset(self, checkpoint_id: PathLike | None = None) -> None:
        """Starts a new save (to ``checkpoint_id`` when given)."""
        if checkpoint_id:
            self.path = fspath(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Learns this rank's role, and whether the ranks coordinate (``use_collectives``):
        without, every rank writes its own metadata (see the module's documentation)."""
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True) is not False

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Creates the directory (an object prefix needs none); without rank coordination,
        names this rank's data file (each rank then plans alone)."""
        if _native.has_directories(self.path):
            os.makedirs(self.path, exist_ok=True)
        if not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data=f"__{self.rank or 0}_{self.save_id}")
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Names each rank's data file after the rank and this save's id (named already
        without rank coordination)."""
        if not self.use_collectives:
            return plans
        return [
            dataclasses.replace(p, storage_data=f"__{i}_{self.save_id}")
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Writes this rank's items to its data file (durable) and returns where each is."""
        prefix = plan.storage_data
        if not isinstance(prefix, str):
            prefix = f"__{self.rank or 0}_{self.save_id}"
        file_name = f"{prefix}.safetensors"
        results: list[WriteResult] = []
        if plan.items:
            path = os.path.join(self.path, file_name)
            specs, views = [], []
            for i, item in enumerate(plan.items):
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    raw = data.getbuffer()  # a memoryview: lent to the engine as a buffer
                    views.append(raw)
                    n = raw.nbytes
                else:
                    raw = held(_raw_bytes(data), path, f"item {item.index}")
                    n = raw.numel()
                specs.append((str(i), "U8", [n], raw))
            try:
                meta = {"format": "fastensor-dcp"}
                self.engine.save(path, specs, meta, checksum=self._checksum)
            finally:
                del specs, raw
                for v in views:
                    v.release()
            where = {e[0]: (e[3], e[4]) for e in self.engine.open(path).entries()}
            for i, item in enumerate(plan.items):
                offset, length = where[str(i)]
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=length,
                        storage_data=StorageInfo(file_name, offset, length),
                    )
                )
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Writes the metadata (the coordinator, once every rank's data is durable; without
        rank coordination, each rank its own), atomically, then removes what it supersedes:
        data files it does not name (of every rank, or of this rank alone) and metadata
        that would be loaded instead or names removed files."""
        storage: dict[MetadataIndex, StorageInfo] = {}
        for rank_results in results:
            for wr in rank_results:
                storage[wr.index] = wr.storage_data
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        named = {info.relative_path for info in storage.values()}
        if self.use_collectives:
            _native.write_whole(
                self.engine, os.path.join(self.path, METADATA_NAME), pickle.dumps(metadata)
            )
            stale = [
                f
                for f in _native.list_names(self.engine, self.path)
                if (_DATA_FILE.fullmatch(f) and f not in named) or _RANK_METADATA.fullmatch(f)
            ]
        else:
            rank = self.rank or 0
            own = os.path.join(self.path, _rank_metadata_name(rank))
            _native.write_whole(self.engine, own, pickle.dumps(metadata))
            # A global metadata file would be loaded instead of every rank's own; it goes
            # before this rank's earlier data files, which it may name.
            _native.remove(self.engine, os.path.join(self.path, METADATA_NAME))
            prefix = f"__{rank}_"
            stale = [
                f
                for f in _native.list_names(self.engine, self.path)
                if _DATA_FILE.fullmatch(f) and f.startswith(prefix) and f not in named
            ]
        for f in stale:
            _native.remove(self.engine, os.path.join(self.path, f))
        if not self.use_collectives:
            _sync_dir(self.path)  # the global metadata's removal is durable too

    def storage_meta(self) -> StorageMeta | None:
        """The checkpoint's id (its directory) and this save's id."""
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint directory."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        """True for anything that names a local path."""
        try:
            os.fspath(checkpoint_id)
        except TypeError:
            return False
        return True

    # -- AsyncStager ----------------------------------------------------------------------

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A CPU copy of ``state_dict`` for ``dcp.async_save`` (reused between saves with
        ``cache_staged_state_dict``)."""
        if not self._cache_staged:
            return super().stage(state_dict)
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        if self._staged is None:
            self._staged = _create_cpu_state_dict(state_dict)
        try:
            return _copy_state_dict(state_dict, self._staged, type_check=False)
        except Exception:  # the structure changed: stage anew
            self._staged = _create_cpu_state_dict(state_dict)
            return _copy_state_dict(state_dict, self._staged, type_check=False)


def _contiguous_box(sizes: list[int], offsets: list[int], lengths: list[int]) -> bool:
    """True when the box ``offsets``/``lengths`` of a contiguous array of ``sizes`` is one
    contiguous run of elements."""
    j = len(sizes) - 1
    while j >= 0 and offsets[j] == 0 and lengths[j] == sizes[j]:
        j -= 1
    return all(lengths[d] == 1 for d in range(j))


def stamp_load_id(metadata: Metadata, load_id: str | None) -> Metadata:
    """``metadata`` with its storage meta (made where it has none) carrying ``load_id``, as
    a storage reader's ``read_metadata`` returns it."""
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = load_id
    return metadata


class Reader(StorageReader):
    """A DCP ``StorageReader`` for checkpoints written by :class:`Writer`.

    Args:
        path: the checkpoint directory, or an object prefix (``s3://bucket/prefix``).
        engine: the fastensor engine to use (default: the shared default engine).
    """

    def __init__(self, path: PathLike, *, engine: Engine | None = None) -> None:
        super().__init__()
        self.path = fspath(path)
        self.engine = engine_or_default(engine)
        self.storage_data: dict[MetadataIndex, StorageInfo] = {}
        self.load_id = uuid.uuid4().hex
        self._chunks: dict[tuple[str, tuple[int, ...]], tuple[torch.dtype, list[int]]] = {}

    def reset(self, checkpoint_id: PathLike | None = None) -> None:
        """Starts a new load (from ``checkpoint_id`` when given)."""
        self.storage_data = {}
        self._chunks = {}
        if checkpoint_id:
            self.path = fspath(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checkpoint's metadata: the global one, or with ``rank=N`` (what ``dcp.load``
        asks for when there is no global one) rank ``N``'s own, written by a save without
        rank coordination.

        Raises:
            FileNotFoundError: the directory holds no such metadata written by :class:`Writer`.
        """
        rank = kwargs.get("rank")
        name = METADATA_NAME if rank is None else _rank_metadata_name(rank)
        path = os.path.join(self.path, name)
        try:
            metadata = pickle.loads(_native.read_whole(self.engine, path))
        except FileNotFoundError:
            hint = ""
            if _native.has_directories(self.path) and os.path.exists(
                os.path.join(self.path, ".metadata")
            ):
                hint = " (it holds a FileSystemWriter checkpoint: load it with FileSystemReader)"
            raise FileNotFoundError(
                f"{self.path}: no fastensor DCP checkpoint ({name} missing){hint}"
            ) from None
        return stamp_load_id(metadata, self.load_id)

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Takes the storage map and every saved chunk's dtype and shape."""
        if metadata.storage_data is None:
            raise ValueError(f"{self.path}: the metadata has no storage data")
        self.storage_data = metadata.storage_data
        self._chunks = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                for c in md.chunks:
                    self._chunks[(fqn, tuple(c.offsets))] = (md.properties.dtype, list(c.sizes))

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The plan as is."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """The plans as they are."""
        return plans

    @property
    def checkpoint_id(self) -> str:
        """The checkpoint directory."""
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        """True for anything that names a local path."""
        return Writer.validate_checkpoint_id(checkpoint_id)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Reads every item of ``plan``: ranged reads, in place where possible, all files in
        flight together."""
        batch = _ReadBatch(self.engine)
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            path = os.path.join(self.path, info.relative_path)
            if item.type == LoadItemType.BYTE_IO:
                buf = bytearray(info.length)
                batch.add(
                    (path, info.offset, buf, 0, info.length),
                    lambda item=item, buf=buf: planner.load_bytes(item, io.BytesIO(buf)),
                    info.length,
                )
            else:
                self._add_tensor(batch, planner, item, info, path)
        batch.flush()
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _add_tensor(
        self,
        batch: _ReadBatch,
        planner: LoadPlanner,
        item: ReadItem,
        info: StorageInfo,
        path: str,
    ) -> None:
        key = (item.storage_index.fqn, tuple(item.storage_index.offset))
        dtype, sizes = self._chunks[key]
        esize = torch.empty((), dtype=dtype).element_size()
        offsets, lengths = list(item.storage_offsets), list(item.lengths)
        target = planner.resolve_tensor(item).detach()
        if list(target.shape) != lengths:
            raise ValueError(
                f"{self.path}: {item.storage_index.fqn}: the destination has shape"
                f" {list(target.shape)}, the slice read {lengths}"
            )
        nbytes = math.prod(lengths) * esize
        if nbytes == 0:
            batch.after(lambda: planner.commit_tensor(item, target))
            return
        strides = [math.prod(sizes[d + 1 :]) for d in range(len(sizes))]
        if (
            target.device.type == "cpu"
            and target.dtype == dtype
            and target.is_contiguous()
            and _contiguous_box(sizes, offsets, lengths)
        ):
            start = sum(o * s for o, s in zip(offsets, strides, strict=False)) * esize
            batch.add(
                (path, info.offset + start, _raw_bytes(target), 0, nbytes),
                lambda: planner.commit_tensor(item, target),
                0,
            )
            return
        # Read the rows of the slice, then copy the slice in.
        if sizes:
            row = strides[0] * esize
            start, n = offsets[0] * row, lengths[0] * row
        else:
            start, n = 0, esize
        raw = torch.empty(n, dtype=torch.uint8)
        src = raw.view(dtype).view([lengths[0], *sizes[1:]] if sizes else [])
        for d in range(1, len(sizes)):
            src = src.narrow(d, offsets[d], lengths[d])

        def finish(target: torch.Tensor = target, src: torch.Tensor = src) -> None:
            target.copy_(src)
            planner.commit_tensor(item, target)

        batch.add((path, info.offset + start, raw, 0, n), finish, n)


class _ReadBatch:
    """Ranged reads gathered for one native call, and what to do once they are in."""

    def __init__(self, engine: _native.Engine) -> None:
        self.engine = engine
        self.ranges: list[tuple[str, int, torch.Tensor, int, int]] = []
        self.then: list[Callable[[], None]] = []
        self.pending = 0

    def add(
        self,
        rng: tuple[str, int, torch.Tensor, int, int],
        then: Callable[[], None],
        temp_bytes: int,
    ) -> None:
        """Reads ``(path, file_offset, destination, byte_offset, nbytes)``, then ``then``."""
        if rng[4]:
            self.ranges.append(rng)
        self.then.append(then)
        self.pending += temp_bytes
        if self.pending >= _PENDING_MAX:
            self.flush()

    def after(self, then: Callable[[], None]) -> None:
        self.then.append(then)

    def flush(self) -> None:
        if self.ranges:
            _native.read_ranges(self.engine, self.ranges)
        for f in self.then:
            f()
        self.ranges, self.then, self.pending = [], [], 0
