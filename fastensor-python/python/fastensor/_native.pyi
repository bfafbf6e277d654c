"""Type stubs of the private native module (the Rust engine).

Memory is passed as the object that owns it (a tensor or array exporting DLPack, or an
object with the buffer protocol), never as an address; every range is checked against it.
"""

from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Protocol, final

__all__ = [
    "Engine",
    "CheckpointFile",
    "SaveHandle",
    "PendingPages",
    "DeviceArray",
    "OffloadStore",
    "OffloadHandle",
    "backends",
    "default_profile_path",
    "parse_flag",
    "direct_read_pad",
    "parse_device_path",
    "OFFLOAD_DEFAULTS",
    "write_atomic",
    "pending_saves",
    "fs_type",
    "set_mmap_threshold",
    "wait_pending_saves",
    "lease_stats",
    "leases_before_fork",
    "leases_after_fork_in_parent",
    "leases_after_fork_in_child",
    "read_new",
    "dtypes",
    "serialize",
    "parse_header",
    "parse_size",
    "ShardedFile",
    "save_sharded",
    "open_sharded",
    "is_sharded",
    "read_ranges",
    "source_digest",
    "group_plan",
    "read_spans",
    "group_choose",
    "group_rule",
    "group_record",
    "read_whole",
    "write_whole",
    "remove",
    "list_names",
    "has_directories",
    "read_slice",
    "checksums",
    "open_verified",
    "verify_file",
    "torch_allocator_enable",
    "torch_allocator_disable",
    "torch_allocator_trim",
    "torch_allocator_stats",
    "torch_allocator_block",
    "__version__",
    "LOAD_ATTEMPTS",
    "CHECKSUMS_KEY",
    "DATA_ALIGN",
]

__version__: str
#: Tries of one load whose file is replaced while it is read (the one retry, native).
LOAD_ATTEMPTS: int
#: The metadata key under which a save's per-tensor checksums are stored.
CHECKSUMS_KEY: str
#: The defaults of offload (Rust's `fastensor::offload::defaults`).
OFFLOAD_DEFAULTS: dict[str, int | bool | str]
#: Bytes of alignment (and spare room) of memory allocated for direct reads.
DATA_ALIGN: int

# Private aliases: stub-only names, absent at runtime.

#: A path argument (converted with ``os.fspath``; ``bytes`` paths are refused).
_Path = str | PathLike[str]
#: A path handed back: a local path as ``pathlib.Path``, an object URL (``s3://``) as ``str``.
_Located = Path | str
#: An object owning memory: a tensor or array exporting DLPack, or a buffer.
_Memory = object
#: A DLPack capsule (``PyCapsule``), consumed by ``torch.from_dlpack`` / ``numpy.from_dlpack``.
_Capsule = object
#: ``(name, dtype, shape, memory)``: the memory holds exactly the tensor's bytes.
_SaveSpec = tuple[str, str, Sequence[int], _Memory]
#: ``(name, memory, byte_offset, nbytes)``.
_TargetSpec = tuple[str, _Memory, int, int]
#: ``(name, dtype, shape, file_offset, nbytes)``.
_Entry = tuple[str, str, list[int], int, int]
#: ``(name, dtype, shape, start, end)``: the bytes at ``start..end`` of the data section.
_HeaderRow = tuple[str, str, list[int], int, int]
#: A loaded tensor: ``(name, dtype, shape, capsule)``.
_Exported = tuple[str, str, list[int], _Capsule]
#: ``(path, file_offset, memory, byte_offset, nbytes)``.
_RangeSpec = tuple[_Path, int, _Memory, int, int]
#: ``(file, start, end, memory, byte_offset)``.
_SpanSpec = tuple[int, int, int, _Memory, int]
#: ``(owner, file, start, end, pieces)``, each piece ``(tensor, start, end)``.
_Message = tuple[int, int, int, int, list[tuple[int, int, int]]]

class _CudaStream(Protocol):
    """A CUDA stream object such as ``torch.cuda.Stream``."""

    @property
    def cuda_stream(self) -> int: ...

@final
class Engine:
    """A fastensor engine: backends, the selector that picks one per transfer, a profile."""

    def __new__(
        cls,
        backends: Sequence[str] | None = None,
        profile: _Path | None = None,
        pin: str | None = None,
        mapped_loads: bool = True,
        unprotected_maps: bool = False,
        cache_dir: _Path | None = None,
        cache_max_bytes: int | None = None,
    ) -> Engine: ...
    def new_loads(self) -> tuple[int, int]: ...
    def decisions(self) -> dict[str, int]: ...
    def backend_names(self) -> list[str]: ...
    def takes_device_memory(self, path: _Path | None = None) -> bool: ...
    def pin(self, backend: str | None = None) -> None: ...
    @property
    def pinned(self) -> str | None: ...
    @property
    def profile_warning(self) -> str | None: ...
    def report(self) -> str: ...
    def save_profile(self) -> None: ...
    def save(
        self,
        path: _Path,
        specs: Sequence[_SaveSpec],
        metadata: dict[str, str] | None = None,
        checksum: bool = False,
    ) -> None: ...
    def save_async(
        self,
        path: _Path,
        specs: Sequence[_SaveSpec],
        metadata: dict[str, str] | None = None,
        checksum: bool = False,
    ) -> SaveHandle: ...
    def load_new(
        self,
        path: _Path,
        names: Sequence[str] | None = None,
        versioned: bool = False,
        verify: bool = False,
    ) -> tuple[list[_Exported], dict[str, str], str]: ...
    def load_new_later(
        self, path: _Path, names: Sequence[str] | None = None
    ) -> tuple[list[_Exported], dict[str, str], PendingPages | None]: ...
    def open(self, path: _Path) -> CheckpointFile: ...
    @property
    def staging_bytes(self) -> int: ...
    def release_staging(self) -> None: ...

@final
class CheckpointFile:
    """An open safetensors file: its header, and reads of its tensors into memory."""

    def entries(self) -> list[_Entry]: ...
    def metadata(self) -> dict[str, str]: ...
    @property
    def path(self) -> _Located: ...
    def read_into(self, targets: Sequence[_TargetSpec]) -> None: ...

@final
class ShardedFile:
    """An open sharded checkpoint; offers what ``CheckpointFile`` offers."""

    def entries(self) -> list[_Entry]: ...
    def names_by_shard(self) -> list[tuple[_Located, list[str]]]: ...
    def metadata(self) -> dict[str, str]: ...
    @property
    def path(self) -> _Located: ...
    @property
    def shards(self) -> list[_Located]: ...
    @property
    def weight_map(self) -> dict[str, str]: ...
    @property
    def total_size(self) -> int | None: ...
    def read_into(self, targets: Sequence[_TargetSpec]) -> None: ...

@final
class SaveHandle:
    """A save running in the background."""

    def done(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> None: ...
    @property
    def path(self) -> _Located: ...
    @property
    def elapsed(self) -> float: ...

@final
class PendingPages:
    """The pages of a mapped load still being brought into memory."""

    def wait(self) -> None: ...
    @property
    def bytes(self) -> int: ...

@final
class DeviceArray:
    """Bytes in CUDA device memory, exported through DLPack."""

    @staticmethod
    def from_bytes(data: bytes, device: int) -> DeviceArray: ...
    @staticmethod
    def zeros(nbytes: int, device: int) -> DeviceArray: ...
    def to_bytes(self) -> bytes: ...
    @property
    def nbytes(self) -> int: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: object = None,
        max_version: tuple[int, int] | None = None,
        dl_device: object = None,
        copy: bool | None = None,
        read_only: bool | None = None,
    ) -> _Capsule: ...

@final
class OffloadHandle:
    """One tensor in an offload store."""

    @property
    def nbytes(self) -> int: ...
    def release(self) -> None: ...

@final
class OffloadStore:
    """An offload store: one swap file, a memory budget, background writes, prefetch."""

    def __new__(
        cls,
        engine: Engine,
        dir: _Path,
        budget: int,
        prefetch_depth: int = ...,
        io_threads: int = ...,
        initial_capacity: int = 0,
        device_path: str = "auto",
        write_behind: int | None = None,
        pack: bool = ...,
        device_write_behind: int | None = None,
    ) -> OffloadStore: ...
    @property
    def path(self) -> Path: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def put(self, owner: _Memory, label: str, whole_pages: bool = False) -> OffloadHandle: ...
    def put_device(self, owner: _Memory, label: str) -> OffloadHandle: ...
    def get_into(
        self, handle: OffloadHandle, dest: _Memory, stream: _CudaStream | None = None
    ) -> None: ...
    def get(
        self, handle: OffloadHandle, length: int | None = None, written: bool = False
    ) -> _Capsule: ...
    def is_written(self, handle: OffloadHandle) -> bool: ...
    def expect_backward(self) -> None: ...
    def discard(self, handle: OffloadHandle) -> None: ...
    def prefetch(self, handles: Sequence[OffloadHandle]) -> None: ...
    def flush(self) -> None: ...
    def stats(self) -> dict[str, float]: ...

def backends() -> list[tuple[str, bool, str | None, str]]: ...
def default_profile_path() -> Path | None: ...
def parse_flag(value: str) -> bool | None: ...
def direct_read_pad(file_offset: int, address: int, nbytes: int, itemsize: int) -> int: ...
def parse_device_path(device_path: str) -> str: ...
def write_atomic(path: _Path, data: bytes) -> None: ...
def pending_saves() -> list[_Located]: ...
def fs_type(path: _Path) -> str: ...
def set_mmap_threshold(threshold: int) -> bool: ...
def wait_pending_saves() -> None: ...
def lease_stats() -> dict[str, float]: ...
def leases_before_fork() -> None: ...
def leases_after_fork_in_parent() -> None: ...
def leases_after_fork_in_child() -> None: ...
def read_new(
    file: CheckpointFile | ShardedFile, names: Sequence[str] | None = None, versioned: bool = False
) -> list[_Exported]: ...
def dtypes() -> list[tuple[str, int]]: ...
def serialize(specs: Sequence[_SaveSpec], metadata: dict[str, str] | None = None) -> bytes: ...
def parse_header(data: _Memory) -> tuple[int, list[_HeaderRow], dict[str, str]]: ...
def parse_size(text: str) -> int: ...
def save_sharded(
    engine: Engine,
    directory: _Path,
    specs: Sequence[_SaveSpec],
    max_shard_bytes: int,
    metadata: dict[str, str] | None = None,
) -> dict[str, str]: ...
def open_sharded(engine: Engine, path: _Path, verify: bool = False) -> ShardedFile: ...
def is_sharded(path: _Path) -> bool: ...
def read_ranges(engine: Engine, ranges: Sequence[_RangeSpec]) -> None: ...
def source_digest(file: CheckpointFile | ShardedFile) -> int: ...
def group_plan(
    file: CheckpointFile | ShardedFile,
    ranks: int,
    split: bool,
    indices: Sequence[int] | None = None,
) -> list[_Message]: ...
def read_spans(file: CheckpointFile | ShardedFile, spans: Sequence[_SpanSpec]) -> None: ...
def group_choose(
    engine: Engine, path: _Path, ranks: int, hosts: int, bytes: int, cuda: bool
) -> tuple[str, bool, str]: ...
def group_rule(path: _Path, ranks: int, hosts: int, bytes: int, cuda: bool) -> str | None: ...
def group_record(
    engine: Engine,
    path: _Path,
    ranks: int,
    hosts: int,
    bytes: int,
    cuda: bool,
    way: str,
    seconds: float,
) -> None: ...
def read_whole(engine: Engine, path: _Path) -> bytes: ...
def write_whole(engine: Engine, path: _Path, data: bytes) -> None: ...
def remove(engine: Engine, path: _Path) -> None: ...
def list_names(engine: Engine, path: _Path) -> list[str]: ...
def has_directories(path: _Path) -> bool: ...
def read_slice(
    file: CheckpointFile, name: str, selection: Sequence[tuple[int, int, int]], dst: _Memory
) -> None: ...
def checksums(specs: Sequence[_SaveSpec]) -> str: ...
def open_verified(engine: Engine, path: _Path) -> CheckpointFile: ...
def verify_file(engine: Engine, path: _Path) -> tuple[int, int]: ...
def torch_allocator_enable(min_bytes: int) -> int: ...
def torch_allocator_disable(token: int) -> None: ...
def torch_allocator_trim() -> int: ...
def torch_allocator_stats() -> dict[str, bool | int | str | None]: ...
def torch_allocator_block(tensor: _Memory) -> int | None: ...
