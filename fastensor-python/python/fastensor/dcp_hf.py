"""``torch.distributed.checkpoint`` (DCP) in the Hugging Face layout, on fastensor's engine.

:class:`HuggingFaceStorageWriter` and :class:`HuggingFaceStorageReader` are torch's classes
of the same names (``torch.distributed.checkpoint.hf_storage``; they subclass them and take
the same arguments) with their file I/O replaced by the engine's, so switching is one
import::

    import torch.distributed.checkpoint as dcp
    from fastensor.dcp_hf import HuggingFaceStorageReader, HuggingFaceStorageWriter

    # Every rank writes its shards, the coordinator consolidates them into full tensors:
    # model-0000K-of-0000N.safetensors + model.safetensors.index.json (what transformers'
    # from_pretrained reads), and the rank files stay in sharded/.
    dcp.save(state_dict, storage_writer=HuggingFaceStorageWriter(
        "out", save_distributed=True, enable_consolidation=True))
    dcp.load(state_dict, storage_reader=HuggingFaceStorageReader("out"))

The files are the ones torch's classes write and read, so a checkpoint written by either
side loads through the other:

* each rank's file is a safetensors file of its chunks, each tensor in its own dtype, with
  torch's ``DCP_SHARDING_INFO`` metadata (each chunk's offsets in the full tensor); written
  by the engine durably and atomically;
* without ``save_distributed``, the coordinator writes ``model.safetensors.index.json``
  (atomically) once every file is durable;
* with ``save_distributed`` and ``enable_consolidation``, the coordinator then builds each
  consolidated file: the chunks of the rank files this save wrote are read by the engine
  straight into the full tensors (chunks split on the first dimension land in place, others
  are read then copied in) and the file saved through the engine; one output file's tensors
  are held in memory at a time (``fqn_to_index_mapping`` sets how many files there are);
  the index is written last, atomically.

The reader takes every ``*.safetensors`` file of the directory (consolidated files, or rank
files with their offsets: a resharding load), and reads through :class:`fastensor.dcp.Reader`:
only the bytes of the slice each rank needs, in place where the destination allows, all
files in flight together. The Hugging Face layout holds tensors only: a state dict with
other objects is refused when saved.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed.checkpoint import hf_storage as _torch_hf
from torch.distributed.checkpoint._hf_utils import (
    CUSTOM_METADATA_KEY,
    DCP_VERSION_KEY,
    FORMAT_KEY,
    FORMAT_VALUE,
    HF_DCP_VERSION,
    SAVED_OFFSETS_KEY,
    SUFFIX,
    _gen_file_name,
    _HFStorageInfo,
    _metadata_fn,
)
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _native
from . import dcp as _fdcp
from . import torch as _fst
from ._common import PathLike, fspath
from ._engine import Engine, engine_or_default

__all__ = ["HuggingFaceStorageReader", "HuggingFaceStorageWriter", "consolidate"]


@dataclasses.dataclass
class HFStorageInfo(_HFStorageInfo):
    """Where a chunk's bytes are: torch's per-chunk storage info (``relative_path`` is the
    file's name in the checkpoint directory) and the byte range of its data in the file."""

    offset: int
    length: int


def _done(value: Any) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


def _index_json(weight_map: Mapping[str, str], total_size: int) -> bytes:
    """The bytes of a ``model.safetensors.index.json`` (as torch's writer lays it out)."""
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(weight_map)}
    return json.dumps(index, indent=2).encode()


class HuggingFaceStorageWriter(_torch_hf.HuggingFaceStorageWriter):
    """torch's ``HuggingFaceStorageWriter`` with every file written by fastensor's engine.

    Args:
        path, fqn_to_index_mapping, thread_count, save_distributed, enable_consolidation,
            thread_count_consolidation: as torch's (``thread_count``: files of a rank written
            at once; ``thread_count_consolidation`` is accepted and unused: the engine
            reads and writes each consolidated file with its own parallelism).
        engine: the fastensor engine to use (default: the shared default engine).
    """

    def __init__(
        self,
        path: PathLike,
        fqn_to_index_mapping: dict[str, int] | None = None,
        thread_count: int = 1,
        save_distributed: bool = False,
        enable_consolidation: bool = False,
        thread_count_consolidation: int = 1,
        *,
        engine: Engine | None = None,
    ) -> None:
        super().__init__(
            fspath(path),
            fqn_to_index_mapping=fqn_to_index_mapping,
            thread_count=thread_count,
            save_distributed=save_distributed,
            enable_consolidation=enable_consolidation,
            thread_count_consolidation=thread_count_consolidation,
        )
        self.engine = engine

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Writes this rank's items, one safetensors file per file index of the plan."""
        if not plan.items:
            return _done([])
        storage_data: dict[str, Any] = plan.storage_data or {}
        mapping = storage_data.get("fqn_to_index_mapping")
        shard_index = storage_data.get("shard_index")
        buckets = self._split_by_storage_plan(mapping, plan.items)
        highest = max(mapping.values()) if mapping is not None else 1
        os.makedirs(self.path, exist_ok=True)
        files = [(_gen_file_name(i, highest, shard_index), items) for i, items in buckets.items()]

        def write(job: tuple[str, list[WriteItem]]) -> list[WriteResult]:
            return self._write_file(planner, *job)

        if self.thread_count > 1 and len(files) > 1:
            with ThreadPoolExecutor(min(self.thread_count, len(files))) as pool:
                parts = list(pool.map(write, files))
        else:
            parts = [write(job) for job in files]
        return _done([r for part in parts for r in part])

    def _write_file(
        self, planner: SavePlanner, file_name: str, items: list[WriteItem]
    ) -> list[WriteResult]:
        """Writes ``items`` to ``file_name`` with torch's metadata; where each one landed."""
        tensors: dict[str, torch.Tensor] = {}
        sharding: dict[str, dict[str, list[int]]] = {}
        for item in items:
            if item.type == WriteItemType.BYTE_IO:
                raise ValueError(
                    f"{self.path}: `{item.index.fqn}` is not a tensor; the Hugging Face layout"
                    " holds tensors only"
                )
            tensors[item.index.fqn] = planner.resolve_data(item)
            sharding[item.index.fqn] = {SAVED_OFFSETS_KEY: list(item.tensor_data.chunk.offsets)}
        path = os.path.join(self.path, file_name)
        meta = {
            CUSTOM_METADATA_KEY: json.dumps(sharding),
            DCP_VERSION_KEY: str(HF_DCP_VERSION),
            FORMAT_KEY: FORMAT_VALUE,
        }
        _fst.save_file(tensors, path, meta, engine=self.engine)
        where = {e[0]: (e[3], e[4]) for e in engine_or_default(self.engine).open(path).entries()}
        results = []
        for item in items:
            offset, length = where[item.index.fqn]
            results.append(
                WriteResult(
                    index=item.index,
                    size_in_bytes=length,
                    storage_data=_StorageInfo(file_name, offset, length),
                )
            )
        return results

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator's last step, once every rank's files are durable: the index
        (atomically), or with ``save_distributed`` and ``enable_consolidation`` the
        consolidated files and then their index; nothing for ``save_distributed`` alone."""
        if self.save_distributed and not self.enable_consolidation:
            return
        if self.save_distributed:
            mapping = self.fqn_to_index_mapping
            if mapping is None:
                mapping = dict.fromkeys(metadata.state_dict_metadata, 1)
            written = sorted({wr.storage_data.relative_path for rs in results for wr in rs})
            consolidate(
                [os.path.join(self.path, f) for f in written],
                self.consolidated_output_path,
                mapping,
                engine=self.engine,
            )
            return
        weight_map, total = {}, 0
        for rs in results:
            for wr in rs:
                weight_map[wr.index.fqn] = wr.storage_data.relative_path
                total += wr.storage_data.length
        _native.write_atomic(os.path.join(self.path, _metadata_fn), _index_json(weight_map, total))


def _chunks_of(engine, files: list[str]) -> dict[str, list[tuple]]:
    """Every chunk of the rank files ``files``, by tensor name: ``(path, data offset,
    nbytes, saved offsets, shape, dtype name)``."""
    chunks: dict[str, list[tuple]] = {}
    for path in files:
        f = engine.open(path)
        info = (f.metadata() or {}).get(CUSTOM_METADATA_KEY)
        if info is None:
            raise ValueError(f"{path}: no {CUSTOM_METADATA_KEY} metadata (not a DCP rank file)")
        offsets = json.loads(info)
        for name, dtype, shape, offset, nbytes in f.entries():
            at = offsets[name][SAVED_OFFSETS_KEY]
            chunks.setdefault(name, []).append((path, offset, nbytes, list(at), shape, dtype))
    return chunks


def consolidate(
    files: list[PathLike],
    output_dir: PathLike,
    fqn_to_index_mapping: Mapping[str, int],
    *,
    engine: Engine | None = None,
) -> dict[str, str]:
    """Builds full tensors from the DCP rank files ``files`` (safetensors files with
    ``DCP_SHARDING_INFO`` metadata, as :class:`HuggingFaceStorageWriter` and torch's write
    them) and saves them in the Hugging Face layout in ``output_dir``: tensor ``name`` in
    ``model-{fqn_to_index_mapping[name]}-of-{N}.safetensors``, then
    ``model.safetensors.index.json``. Each output file is read and written by the engine
    (see the module's documentation); returns the weight map.

    Raises:
        KeyError: a tensor of the files that ``fqn_to_index_mapping`` does not place.
        ValueError: a file without DCP's metadata.
    """
    native = engine_or_default(engine)
    out_dir = fspath(output_dir)
    os.makedirs(out_dir, exist_ok=True)
    chunks = _chunks_of(native, [fspath(f) for f in files])
    highest = max(fqn_to_index_mapping.values())
    by_file: dict[str, list[str]] = {}
    for name in chunks:
        by_file.setdefault(_gen_file_name(fqn_to_index_mapping[name], highest), []).append(name)
    weight_map, total = {}, 0
    for file_name, names in sorted(by_file.items()):
        tensors = _assemble(native, chunks, names)
        _fst.save_file(tensors, os.path.join(out_dir, file_name), {"format": "pt"}, engine=engine)
        for name, t in tensors.items():
            weight_map[name] = file_name
            total += t.numel() * t.element_size()
        del tensors
    _native.write_atomic(os.path.join(out_dir, _metadata_fn), _index_json(weight_map, total))
    return weight_map


def _assemble(native, chunks: dict[str, list[tuple]], names: list[str]) -> dict[str, torch.Tensor]:
    """The full tensors ``names``, their chunks read by the engine in one batch."""
    batch = _fdcp._ReadBatch(native)
    out = {}
    for name in names:
        parts = chunks[name]
        dtype = _fst._torch_dtype(parts[0][0], name, parts[0][5])
        size = [max(p[3][d] + p[4][d] for p in parts) for d in range(len(parts[0][4]))]
        full = torch.empty(size, dtype=dtype)
        out[name] = full
        esize = full.element_size()
        strides = [math.prod(size[d + 1 :]) for d in range(len(size))]
        for path, offset, nbytes, at, shape, _ in parts:
            if nbytes == 0:
                continue
            if _fdcp._contiguous_box(size, at, shape):
                start = sum(o * s for o, s in zip(at, strides, strict=True)) * esize
                batch.add((path, offset, _fdcp._raw_bytes(full), start, nbytes), lambda: None, 0)
            else:
                part = torch.empty(shape, dtype=dtype)
                view = full
                for d, (o, n) in enumerate(zip(at, shape, strict=True)):
                    view = view.narrow(d, o, n)

                def copy_in(view: torch.Tensor = view, part: torch.Tensor = part) -> None:
                    view.copy_(part)

                batch.add((path, offset, _fdcp._raw_bytes(part), 0, nbytes), copy_in, nbytes)
    batch.flush()
    return out


class HuggingFaceStorageReader(_torch_hf.HuggingFaceStorageReader):
    """torch's ``HuggingFaceStorageReader`` with every read done by fastensor's engine.

    Args:
        path: the checkpoint directory (its ``*.safetensors`` files are read).
        thread_count: accepted for compatibility (the engine reads all files at once).
        engine: the fastensor engine to use (default: the shared default engine).
    """

    def __init__(
        self, path: PathLike, thread_count: int = 1, *, engine: Engine | None = None
    ) -> None:
        super().__init__(fspath(path), thread_count=thread_count)
        self.engine = engine
        self._reader = _fdcp.Reader(fspath(path), engine=engine)

    def read_metadata(self) -> Metadata:
        """The checkpoint's metadata, from the headers of its ``*.safetensors`` files (each
        tensor's full shape and chunks; a rank file's chunks at their saved offsets).

        Raises:
            FileNotFoundError: the directory holds no ``*.safetensors`` file.
        """
        native = engine_or_default(self.engine)
        directory = str(self.path)
        files = sorted(f for f in os.listdir(directory) if f.endswith(SUFFIX))
        if not files:
            raise FileNotFoundError(f"{directory}: no {SUFFIX} files to read")
        sd_meta: dict[str, TensorStorageMetadata] = {}
        storage: dict[MetadataIndex, HFStorageInfo] = {}
        for file_name in files:
            path = os.path.join(directory, file_name)
            f = native.open(path)
            info = (f.metadata() or {}).get(CUSTOM_METADATA_KEY)
            sharding = json.loads(info) if info else None
            for name, dtype_name, shape, offset, nbytes in f.entries():
                dtype = _fst._torch_dtype(path, name, dtype_name)
                at = list(sharding[name][SAVED_OFFSETS_KEY]) if sharding else [0] * len(shape)
                chunk = ChunkStorageMetadata(offsets=torch.Size(at), sizes=torch.Size(shape))
                end = [o + s for o, s in zip(at, shape, strict=True)]
                md = sd_meta.get(name)
                if md is None:
                    sd_meta[name] = TensorStorageMetadata(
                        properties=TensorProperties(dtype=dtype),
                        size=torch.Size(end),
                        chunks=[chunk],
                    )
                else:
                    md.chunks.append(chunk)
                    md.size = torch.Size(max(a, b) for a, b in zip(md.size, end, strict=True))
                storage[MetadataIndex(fqn=name, offset=at)] = HFStorageInfo(
                    relative_path=file_name,
                    shape=torch.Size(shape),
                    dtype=dtype,
                    offset=offset,
                    length=nbytes,
                )
        metadata = Metadata(state_dict_metadata=sd_meta, storage_data=storage)
        return _fdcp.stamp_load_id(metadata, self.load_id)

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Takes the storage map (and each chunk's dtype and shape) for the reads."""
        super().set_up_storage_reader(metadata, is_coordinator)
        self._reader.path = str(self.path)
        self._reader.set_up_storage_reader(metadata, is_coordinator)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Reads every item of ``plan`` (see :meth:`fastensor.dcp.Reader.read_data`)."""
        return self._reader.read_data(plan, planner)
