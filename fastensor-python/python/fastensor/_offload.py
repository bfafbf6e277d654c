"""Activation offload inside PyTorch autograd: :func:`offload`.

Inside ``with offload(...)``, the tensors autograd saves for backward go to a swap file on
disk through fastensor's Rust ``OffloadStore`` (background writes, a memory budget,
prefetch in backward order), over ``torch.autograd.graph.saved_tensors_hooks``::

    with fastensor.torch.offload(budget_bytes=256 << 20) as stats:
        loss = model(x).sum()
    loss.backward()
    print(stats)

Who owns what:

- Memory: while a block's graphs live, torch's CPU allocations of 256 KiB or more come from
  fastensor's host pool (:class:`fastensor.torch.caching_allocator`), and the store reads
  offloaded tensors back into blocks of the same pool: the memory an activation frees once
  written serves the next activation, or the read of an earlier one, already faulted in.
- A saved tensor's storage is written in place (a pool block is page-aligned: direct I/O
  takes it without a copy, to its page-rounded length). The store keeps a reference to the
  storage until it is written, and after that while ``budget_bytes`` has room: the last
  tensors saved by the forward pass are the first backward needs, and take no read. The
  last of them (``write_behind`` bytes: by default the budget less room for the writes in
  flight) are not even written
  unless a later pack needs their room: backward takes them straight from memory.
  The budget counts everything the store holds (tensors being written or kept, reads in
  flight, tensors read back ahead); a pack waits (with the GIL released) for room, after
  dropping the kept tensors needed last. A storage larger than the whole budget is written
  on the spot instead (the pack returns once it is on disk) and never held.
- On its way to the swap file a storage is cut into 1 MiB chunks; a chunk that holds only 0
  and one other value (a dropout mask, float or bool; zeros) or is mostly zeros is written
  as a bitmap (through a scratch block of the pool sized to the transfer, at most 4 MiB,
  outside the budget) and unpacked into the block it is read back into, bit for bit
  (``pack``).
- On unpack, a storage still in memory (kept, or alive elsewhere) is used as it is; else its
  bytes come back in a pool block the store read them into (ahead of time when prefetched);
  ``torch.from_dlpack`` turns it into a tensor that owns the block, which goes back to the
  pool when that tensor is freed. The saved tensor is rebuilt as a view of it with its
  dtype, shape, strides and storage offset, so views of one storage share one write and one
  read.
- CUDA tensors: the last ones saved (``budget_bytes`` of them per device) stay on their
  device, unoffloaded, since backward needs them first. Older ones are handed to the store
  through DLPack with the stream handshake: a copy stream of the store's waits for the
  compute stream's work on the tensor, copies it into pinned memory reused step after step
  (or, where cuFile moves device memory itself, the tensor is written from device memory),
  and the device memory is given back once that copy (or write) has passed. On unpack the
  bytes are copied into new device memory on the current stream, which orders them before
  backward's kernels. Nothing waits for the device in pack or unpack.

The swap file is read and written around the page cache (where a backend that does so can
open it): a cached copy would hold the very memory offload frees. It lives as long as the
block runs or any graph built inside it still holds an offloaded tensor, and its space is
freed when the last one is (after backward, or when a graph is dropped without one). It has
no name in the directory (``O_TMPFILE``, else unlinked once open), so no crash or kill can
leave it behind.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import os
import tempfile
import threading
import time
import warnings
import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import _native
from ._allocator import _disable as _allocator_disable
from ._allocator import _enable as _allocator_enable
from ._engine import Engine, engine_or_default
from .errors import FileChangedError, _invalid

__all__ = ["OffloadStats", "offload", "release_freed_memory"]

#: The defaults of offload: Rust's table (``fastensor::offload::defaults``), one for both.
_DEFAULTS: dict[str, Any] = _native.OFFLOAD_DEFAULTS

#: Prefetch depth standing for "as many tensors as the budget holds".
_UNLIMITED: int = _DEFAULTS["prefetch_as_budget_holds"]

#: The most glibc accepts as its mmap threshold (64-bit).
_MMAP_THRESHOLD_MAX = 32 << 20

#: torch's CPU requests of at least this many bytes come from the pool while offload runs.
_POOL_MIN_BYTES: int = _DEFAULTS["pool_min_bytes"]

#: The mmap threshold this module set (None: malloc left alone so far).
_mmap_threshold: int | None = None

#: The swap file size the last block in each directory needed: the next block's store
#: reserves it at once (growing a swap file while writes are in flight waits for them).
_capacity_hints: dict[str, int] = {}

_live_sessions: weakref.WeakSet[_Session] = weakref.WeakSet()
_live_lock = threading.Lock()


def _default_dir() -> str:
    """``$FASTENSOR_OFFLOAD_DIR``, else the system's temporary directory."""
    return os.environ.get("FASTENSOR_OFFLOAD_DIR") or tempfile.gettempdir()


def release_freed_memory(threshold: int = 1 << 20) -> bool:
    """Makes glibc give blocks of at least ``threshold`` bytes back to the system when freed.

    glibc's malloc raises its mmap threshold as large blocks are freed, after which such
    blocks come from its heap, and freed ones stay there (docs/lab/offload-allocator.md has the
    figures). Fixing the threshold (``mallopt``, as ``MALLOC_MMAP_THRESHOLD_`` does) maps
    such blocks on their own and unmaps them on free.

    Never called behind the caller's back: only by the caller, or by
    ``offload(..., release_memory=True)`` (with its ``min_bytes``, where the pool is not in
    use). It affects the whole process (every library's ``malloc``), for the rest of its life
    (glibc cannot tell the threshold it replaces, so it is not put back), and each large
    allocation then faults in fresh pages. Returns whether the threshold is set (False off
    glibc).
    """
    global _mmap_threshold
    threshold = max(1, min(int(threshold), _MMAP_THRESHOLD_MAX))
    if _mmap_threshold is not None and _mmap_threshold <= threshold:
        return True
    if not _native.set_mmap_threshold(threshold):
        return False
    _mmap_threshold = threshold
    return True


def _close_all_at_exit() -> None:
    with _live_lock:
        sessions = list(_live_sessions)
    for s in sessions:
        s.close()


atexit.register(_close_all_at_exit)


class _Record:
    """One offloaded storage: its handle in the store, and its bytes once restored."""

    __slots__ = (
        "session",
        "handle",
        "kept",
        "tail_key",
        "source",
        "original",
        "saved",
        "base",
        "version",
        "confirmed",
        "device",
        "nbytes",
        "restored",
        "__weakref__",
    )

    def __init__(self, session: _Session, handle: Any, source: StorageWeakRef, device, nbytes):
        self.session = session
        self.handle = handle
        #: A CUDA storage kept on its device, not offloaded (yet): a uint8 tensor over it,
        #: and its key in the session's tail.
        self.kept: torch.Tensor | None = None
        self.tail_key = 0
        #: The original storage, weakly: a dead one means its address may be reused.
        self.source = source
        #: The original storage's Python object (CPU), weakly: alive while its write is still
        #: pending or something else holds it; unpack then takes it as it is.
        self.original: weakref.ref | None = None
        #: The saved tensor (weakly) and its version when packed: a tensor changed in place
        #: since then comes back from disk, as packed (once its write was seen finished).
        self.saved: weakref.ref | None = None
        #: The saved tensor's base when it is a view (weakly): it shares the view's version
        #: counter and lives as long as any view of it, so a change through any of them is
        #: seen after a temporary saved view is gone.
        self.base: weakref.ref | None = None
        self.version = 0
        #: The session saw the write of these bytes finished while the tensor was still at
        #: its packed version: the bytes on disk are the ones packed, whatever is done to
        #: the tensor after (see ``_Session.confirm_writes``).
        self.confirmed = False
        self.device = device
        self.nbytes = nbytes
        #: The storage read back (kept while a saved tensor still refers to this record).
        self.restored: torch.UntypedStorage | None = None

    def changed(self) -> bool:
        """Whether the saved tensor was changed in place since packed, as autograd tells:
        by the version counter the saved tensor shares with its base and every view of it,
        read through whichever of the two still lives (neither: no tensor is left that
        could change it)."""
        for ref in (self.saved, self.base):
            t = ref() if ref is not None else None
            if t is not None:
                return t._version != self.version
        return False

    def in_memory(self) -> torch.UntypedStorage | None:
        """The original storage when it is still alive and unchanged since packed."""
        original = self.original() if self.original is not None else None
        if original is None or self.changed():
            return None
        return original


# A packed saved tensor: its record, dtype, size, stride and storage offset.
_Packed = tuple


def _field(name: str, doc: str) -> property:
    return property(lambda self: self.as_dict()[name], doc=doc)


class OffloadStats:
    """What an :func:`offload` block did; read it any time (live while its store is open,
    the final figures after it closed). Bytes are ints, times seconds."""

    def __init__(self, session: _Session):
        self._session = weakref.ref(session)
        self._final: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Every figure as a dict."""
        s = self._session()
        if s is not None and self._final is None:
            return s.figures()
        return dict(self._final or {})

    budget_bytes = _field("budget_bytes", "The memory budget of the store.")
    tensors_offloaded = _field("tensors_offloaded", "Storages written to the swap file.")
    bytes_offloaded = _field("bytes_offloaded", "Bytes of the storages handed to the store.")
    saves_deduplicated = _field(
        "saves_deduplicated", "Saves answered by a storage already offloaded (no new write)."
    )
    tensors_kept = _field(
        "tensors_kept", "Saved tensors left in memory (small, parameters, other leaves)."
    )
    bytes_kept = _field("bytes_kept", "Bytes of the tensors left in memory (by storage).")
    peak_held_bytes = _field(
        "peak_held_bytes",
        "Most bytes the store held at once (being written, kept, or read back); at most the "
        "budget.",
    )
    peak_resident_bytes = _field(
        "peak_resident_bytes",
        "The process's largest resident memory (bytes, as the kernel counts it) seen by a "
        "pack or unpack.",
    )
    written_through = _field(
        "written_through", "Storages larger than the budget, written on the spot by the pack."
    )
    held_bytes = _field("held_bytes", "Bytes the store holds now.")
    bytes_written = _field(
        "bytes_written", "Bytes of the tensors written to the swap file (as in memory)."
    )
    bytes_read = _field(
        "bytes_read", "Bytes of the tensors read back from the swap file (as in memory)."
    )
    file_bytes_written = _field(
        "file_bytes_written",
        "Bytes that crossed to the swap file: ``bytes_written`` less what packing saved.",
    )
    file_bytes_read = _field(
        "file_bytes_read",
        "Bytes that came from the swap file: ``bytes_read`` less what packing saved.",
    )
    bytes_never_written = _field(
        "bytes_never_written",
        "Bytes of offloaded storages backward took from memory before they were ever written "
        "(the last ones saved: ``write_behind``).",
    )
    unpacks = _field("unpacks", "Saved tensors unpacked (each view counted).")
    restored_in_place = _field(
        "restored_in_place",
        "Offloaded storages backward took from their original memory, still alive (no read).",
    )
    unpack_stall_s = _field(
        "unpack_stall_s", "Time unpack waited for bytes to come back (wall, in backward)."
    )
    pack_wait_s = _field("pack_wait_s", "Time pack waited for room in the budget (forward).")
    write_time_s = _field("write_time_s", "Time the I/O threads spent writing.")
    read_time_s = _field("read_time_s", "Time spent reading back (prefetch and on demand).")
    prefetches = _field("prefetches", "Reads started ahead of their unpack.")
    gets_from_memory = _field(
        "gets_from_memory", "Reads back answered from memory (prefetched or still there)."
    )
    swap_path = _field("swap_path", "The swap file's path.")
    devices = _field(
        "devices",
        "Per CUDA device (``'cuda:0'``...): bytes offloaded, bytes kept on the device (the last "
        "ones saved, used in place by backward), and the time unpack waited.",
    )
    bytes_to_host = _field(
        "bytes_to_host", "Bytes copied out of GPU memory into pinned memory (the staged path)."
    )
    bytes_to_device = _field("bytes_to_device", "Bytes copied back into GPU memory.")
    caching_allocator = _field(
        "caching_allocator",
        "Whether torch's large CPU allocations came from fastensor's pool.",
    )

    @property
    def write_gbps(self) -> float:
        """Write bandwidth: bytes written per second of writing (GB/s)."""
        d = self.as_dict()
        return d["bytes_written"] / d["write_time_s"] / 1e9 if d["write_time_s"] else 0.0

    @property
    def read_gbps(self) -> float:
        """Read bandwidth: bytes read per second of reading (GB/s)."""
        d = self.as_dict()
        return d["bytes_read"] / d["read_time_s"] / 1e9 if d["read_time_s"] else 0.0

    def __repr__(self) -> str:
        d = self.as_dict()
        if not d:
            return "<OffloadStats (none)>"
        return (
            f"<OffloadStats offloaded {d['bytes_offloaded'] / 2**20:.1f} MiB in "
            f"{d['tensors_offloaded']} tensors (kept {d['bytes_kept'] / 2**20:.1f} MiB), "
            f"peak held {d['peak_held_bytes'] / 2**20:.1f} of "
            f"{d['budget_bytes'] / 2**20:.1f} MiB, unpack stall {d['unpack_stall_s']:.3f} s, "
            f"written {d['bytes_written'] / 2**20:.1f} MiB as "
            f"{d['file_bytes_written'] / 2**20:.1f} MiB to disk, "
            f"write {self.write_gbps:.2f} GB/s, read {self.read_gbps:.2f} GB/s>"
        )


class _Session:
    """One store and the bookkeeping of the tensors packed into it. It lives while its
    block runs or any record is alive, and closes the store when it dies."""

    def __init__(
        self,
        store: Any,
        min_bytes: int,
        depth: int,
        allocator: tuple,
        hint_key: str,
        gpu_keep_bytes: int,
    ):
        self.store = store
        self.hint_key = hint_key
        self.min_bytes = min_bytes
        self.depth = depth
        #: The caching allocator's token while this session uses it, and why not otherwise.
        self.allocator_token, self.allocator_reason = allocator
        self.by_key: dict[tuple, weakref.ref[_Record]] = {}
        self.counts = dict.fromkeys(
            (
                "tensors_offloaded",
                "bytes_offloaded",
                "saves_deduplicated",
                "tensors_kept",
                "bytes_kept",
                "unpacks",
                "restored_in_place",
            ),
            0,
        )
        self.unpack_stall_s = 0.0
        #: CUDA storages kept on their device, oldest first, per device (weakly: a record
        #: dies with its graph), and their bytes.
        self.gpu_tail: dict[torch.device, collections.OrderedDict[int, tuple]] = {}
        self.gpu_tail_bytes: dict[torch.device, int] = {}
        self.tail_keys = itertools.count(1)
        self.gpu_keep_bytes = gpu_keep_bytes
        #: Per CUDA device: bytes offloaded, bytes kept on the device, unpack stall.
        self.per_device: dict[str, dict[str, float]] = {}
        self.labels = itertools.count()
        #: CPU records whose write was not seen finished yet, oldest first (weakly).
        self.unconfirmed: collections.deque[weakref.ref[_Record]] = collections.deque()
        self.stats = OffloadStats(self)
        self.swap_path = os.fspath(store.path)
        with _live_lock:
            _live_sessions.add(self)

    # -- figures

    def confirm_writes(self) -> None:
        """Marks ``confirmed`` the records, oldest first, whose write has finished while
        their tensor is still at its packed version; stops at the first one still unwritten
        (the store writes oldest first). Called at each pack and unpack, at the end of the
        block and whenever the figures are read: a tensor changed in place after its write
        was seen finished comes back from disk as packed; changed before, unpack raises
        as autograd does (the bytes on disk may be the changed ones: a write in flight
        reads the tensor's memory as it is changed)."""
        queue = self.unconfirmed
        while queue:
            rec = queue[0]()
            if rec is None or rec.restored is not None or rec.changed():
                queue.popleft()  # gone, back already, or changed first: never confirmed
                continue
            if self.store.closed or not self.store.is_written(rec.handle):
                return
            rec.confirmed = True
            queue.popleft()

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counts)
        out["unpack_stall_s"] = self.unpack_stall_s
        out["swap_path"] = self.swap_path
        out["devices"] = {k: dict(v) for k, v in self.per_device.items()}
        out["caching_allocator"] = self.allocator_token is not None
        out["caching_allocator_reason"] = self.allocator_reason
        if not self.store.closed:
            n = self.store.stats()
            self._native = n
            # After the figures: a write they count as done is seen finished.
            self.confirm_writes()
        else:
            n = getattr(self, "_native", None) or {}
        out["budget_bytes"] = n.get("budget", 0)
        for k in (
            "peak_held_bytes",
            "held_bytes",
            "bytes_written",
            "bytes_read",
            "file_bytes_written",
            "file_bytes_read",
            "prefetches",
            "peak_resident_bytes",
            "written_through",
            "bytes_never_written",
        ):
            out[k] = n.get(k, 0)
        out["gets_from_memory"] = n.get("gets_from_memory", 0)
        for k in ("bytes_to_host", "bytes_to_device", "device_puts", "device_gets"):
            out[k] = n.get(k, 0)
        out["stage_wait_s"] = n.get("stage_wait_s", 0.0)
        out["pack_wait_s"] = n.get("put_wait_s", 0.0)
        out["write_time_s"] = n.get("write_time_s", 0.0)
        out["read_time_s"] = n.get("read_time_s", 0.0)
        return out

    def close(self) -> None:
        """Closes the store (removes the swap file); keeps the final figures."""
        if self.store.closed:
            return
        final = self.figures()
        capacity = getattr(self, "_native", {}).get("file_capacity", 0)
        if capacity:
            _capacity_hints[self.hint_key] = capacity
        # Cancels what is still queued: nothing is held after it (a pack or unpack under
        # way in another thread finishes on the store first, which goes then); never waits
        # for such a call while holding the GIL it needs.
        self.store.close()
        token, self.allocator_token = self.allocator_token, None
        _allocator_disable(token)
        final["held_bytes"] = 0
        self.stats._final = final
        with _live_lock:
            _live_sessions.discard(self)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- the hooks

    def _keep(self, storage_bytes: int) -> None:
        self.counts["tensors_kept"] += 1
        self.counts["bytes_kept"] += storage_bytes

    def pack(self, t: torch.Tensor) -> torch.Tensor | _Packed:
        """The saved tensor ``t`` itself (kept in memory), or a packed reference to it."""
        if (
            type(t) is not torch.Tensor
            and not isinstance(t, torch.nn.Parameter)
            or t.layout != torch.strided
            or t.is_conj()
            or t.is_neg()
        ):
            self._keep(0)
            return t  # sparse, subclasses, lazy conjugates: left as they are
        base = t if t._base is None else t._base
        if base.is_leaf and base.requires_grad:
            self._keep(0)
            return t  # parameters (and views of them), leaves that require grad
        self.confirm_writes()
        dev = t.device
        if dev.type not in ("cpu", "cuda"):
            raise _invalid(f"fastensor offload: tensors on {dev} are not supported (cpu, cuda)")
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes < self.min_bytes:
            self._keep(nbytes)
            return t
        key = (dev, storage.data_ptr(), t._version)
        ref = self.by_key.get(key)
        rec = ref() if ref is not None else None
        if rec is None or rec.source.expired():
            rec = self._offload(storage, dev, nbytes)
            rec.saved = weakref.ref(t)
            if t._base is not None:
                rec.base = weakref.ref(t._base)
            rec.version = t._version
            if dev.type == "cpu":
                rec.original = weakref.ref(storage)
                self.unconfirmed.append(weakref.ref(rec))
            by_key = self.by_key

            def forget(r: weakref.ref, key: tuple = key) -> None:
                if by_key.get(key) is r:
                    del by_key[key]

            r = weakref.ref(rec, forget)
            self.by_key[key] = r
        else:
            self.counts["saves_deduplicated"] += 1
        return (rec, t.dtype, t.size(), t.stride(), t.storage_offset())

    def _offload(self, storage: torch.UntypedStorage, dev: torch.device, nbytes: int) -> _Record:
        source = StorageWeakRef(storage)
        flat = torch.empty(0, dtype=torch.uint8, device=dev).set_(storage)
        self.counts["tensors_offloaded"] += 1
        self.counts["bytes_offloaded"] += nbytes
        if dev.type == "cuda":
            rec = _Record(self, None, source, dev, nbytes)
            self._keep_on_device(rec, flat)
            return rec
        # A block of the caching allocator may be written to its page-rounded end (direct
        # I/O from the tensor, with no copy of a partial page): the store checks the block.
        handle = self.store.put(flat, f"saved{next(self.labels)}", whole_pages=True)
        return _Record(self, handle, source, dev, nbytes)

    def _device_figures(self, dev: torch.device) -> dict[str, float]:
        return self.per_device.setdefault(
            str(dev),
            {"bytes_offloaded": 0, "bytes_kept_on_device": 0, "unpack_stall_s": 0.0},
        )

    def _keep_on_device(self, rec: _Record, flat: torch.Tensor) -> None:
        """Keeps a CUDA storage on its device as the newest of the tail; hands the oldest
        ones to the store while the tail holds more than its budget."""
        dev = rec.device
        rec.kept = flat
        tail = self.gpu_tail.setdefault(dev, collections.OrderedDict())
        rec.tail_key = next(self.tail_keys)
        tail[rec.tail_key] = (weakref.ref(rec), rec.nbytes)
        self.gpu_tail_bytes[dev] = self.gpu_tail_bytes.get(dev, 0) + rec.nbytes
        while self.gpu_tail_bytes[dev] > self.gpu_keep_bytes and tail:
            ref, nbytes = next(iter(tail.values()))
            old = ref()
            if old is not None and old.kept is not None:
                # Handed over with the stream handshake: no wait for the device here. Should
                # the store refuse it, the record keeps its tensor on the device (and the
                # error is raised in the forward pass).
                old.handle = self.store.put_device(old.kept, f"saved{next(self.labels)}")
                kept, old.kept = old.kept, None
                old.original = weakref.ref(kept.untyped_storage())
                self._device_figures(dev)["bytes_offloaded"] += nbytes
            tail.popitem(last=False)
            self.gpu_tail_bytes[dev] -= nbytes

    def _take_kept(self, rec: _Record) -> torch.UntypedStorage | None:
        """The storage of a record still kept on its device (leaving the tail), or None."""
        if rec.kept is None:
            return None
        tail = self.gpu_tail.get(rec.device)
        if tail is not None and tail.pop(rec.tail_key, None) is not None:
            self.gpu_tail_bytes[rec.device] -= rec.nbytes
        kept, rec.kept = rec.kept, None
        self._device_figures(rec.device)["bytes_kept_on_device"] += rec.nbytes
        return kept.untyped_storage()

    def unpack(self, p: torch.Tensor | _Packed) -> torch.Tensor:
        """The saved tensor back: ``p`` itself, or rebuilt from the bytes read back."""
        if isinstance(p, torch.Tensor):
            return p
        rec, dtype, size, stride, offset = p
        self.counts["unpacks"] += 1
        self.confirm_writes()
        storage = rec.restored
        if storage is None:
            storage = self._take_kept(rec)
            if storage is not None:
                rec.restored = storage
        if storage is None:
            storage = rec.in_memory()
            if storage is not None:
                # Still in memory (its write pending, or held elsewhere): no read at all.
                self.store.discard(rec.handle)
                self.counts["restored_in_place"] += 1
                rec.restored = storage
        if storage is None and rec.device.type == "cuda":
            t0 = time.perf_counter()
            flat = torch.empty(rec.nbytes, dtype=torch.uint8, device=rec.device)
            # Queued on the current stream, before backward's kernels: no wait here.
            self.store.get_into(rec.handle, flat, torch.cuda.current_stream(rec.device))
            stall = time.perf_counter() - t0
            self.unpack_stall_s += stall
            self._device_figures(rec.device)["unpack_stall_s"] += stall
            storage = flat.untyped_storage()
            rec.restored = storage
        if storage is None:
            t0 = time.perf_counter()
            # Memory the store holds is the original storage's. Changed since packed after
            # its write was seen finished, the bytes come from disk as they were packed;
            # changed before, the bytes as packed may be nowhere (a write in flight reads the
            # memory as it changes), which autograd itself refuses without offload. Gone
            # (only the store still holds it), it is unchanged.
            changed = rec.changed()
            if changed and not rec.confirmed:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified "
                    "by an inplace operation after fastensor offload saved it, before its "
                    "write to the swap file was seen finished (offload keeps the bytes as "
                    "saved only once written)"
                )
            try:
                got = self.store.get(rec.handle, rec.nbytes, written=changed)
            except FileChangedError as e:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified "
                    "by an inplace operation after fastensor offload saved it, before it was "
                    "written (offload(write_behind=0) writes every saved tensor at once, "
                    "keeping the bytes as saved)"
                ) from e
            flat = torch.from_dlpack(got)
            self.unpack_stall_s += time.perf_counter() - t0
            storage = flat.untyped_storage()
            rec.restored = storage
        out = torch.empty(0, dtype=dtype, device=rec.device)
        return out.set_(storage, offset, size, stride)


class offload:  # noqa: N801 (a context manager named as a function, like torch.no_grad)
    """Offloads the tensors autograd saves inside the block to a swap file on disk.

    ``with offload(...) as stats:`` around the forward pass: every tensor saved for
    backward whose storage has at least ``min_bytes`` is written to the swap file in the
    background (its memory freed once written), and read back when backward needs it:
    from the first unpack on (backward's start), the store reads ahead in the reverse of
    the order the tensors were saved, so reads overlap backward compute.
    Parameters, views of them, other leaves that require grad and small tensors stay in
    memory (offloading them frees nothing). The same storage saved several times (views,
    the same tensor twice) is written once. Gradients are bit-identical to a run without
    offload. Backward may run after the block; the swap file's space is freed once every
    graph built inside the block is freed (after its backward, or when dropped).

    Args:
        dir: directory of the swap file (an SSD); default ``$FASTENSOR_OFFLOAD_DIR``, else
            the system's temporary directory (warned about when it is in memory: tmpfs).
        budget_bytes: most bytes the store holds in memory at once: saved tensors being
            written or kept after their write (the last ones saved stay, for the start of
            backward), and tensors read back ahead of use; packs wait while it is full.
            Default 1 GiB. A saved storage larger than the budget is written on the spot
            and read back when backward needs it.
        min_bytes: storages smaller than this stay in memory (default 1 MiB).
        prefetch: how many tensors to read back ahead of backward; ``None`` (default): as
            many as the budget holds; ``0``: none (each unpack reads its own).
        io_threads: background I/O threads (default 2).
        write_behind: most bytes of the last tensors saved that wait in memory unwritten
            (within the budget): backward needs them first and takes them from memory, so
            they are never written nor read; older ones are written, oldest first, and a pack
            that needs their room starts their writes. ``None`` (default): ``budget_bytes``
            less room for the writes in flight (the smaller of half the budget and four times
            the largest tensor saved); ``0``: every tensor is written as soon as it is saved. A
            tensor changed in place after it was saved (which autograd refuses without
            offload; a change through a view or the base of the tensor saved counts) comes
            back from disk as it was saved where its write was seen finished before the
            change (at a pack, an unpack, the end of the block, or a read of ``stats``);
            changed before that (unwritten, or its write in flight), backward raises
            ``RuntimeError`` as autograd does.
        pack: store chunks of saved tensors that are mostly zeros or hold only 0 and one
            other value (dropout masks, as float or bool; all-zero blocks) as bitmaps in the
            swap file, and unpack them when read back, bit for bit: fewer bytes cross to the
            disk and back. Other chunks cost a glance at their first 4 KiB and go as they
            are. Default True; ``stats.file_bytes_written`` against ``stats.bytes_written``
            shows what it saved.
        caching_allocator: serve torch's CPU allocations of 256 KiB or more from fastensor's
            host pool while the block's graphs live (see
            :class:`fastensor.torch.caching_allocator`): the memory each offloaded tensor
            frees serves the next activation (or a read back), already faulted in, and is
            written to disk without a copy. Default True; where torch's allocator cannot be
            replaced, ``stats.as_dict()["caching_allocator_reason"]`` says why (offload
            works without it, holding more memory).
        device_path: how CUDA tensors reach the swap file: ``"staged"`` (copied into pinned
            memory on a copy stream, written through the host path), ``"direct"`` (written
            from device memory: cuFile), or ``"auto"`` (direct where cuFile moves device
            memory itself, GPUDirect Storage; else staged).
        release_memory: where the pool is not in use, make glibc give freed blocks of
            ``min_bytes`` or more back to the system (:func:`release_freed_memory`:
            ``mallopt``, process-wide and for the rest of the process), so that the memory
            of offloaded tensors is really freed. Default False: malloc is left alone.
        engine: the fastensor engine to use (default: the module's engine).

    Yields:
        OffloadStats: live counters (bytes offloaded, peak held, unpack stall, bandwidth).

    Raises:
        ValueError (InvalidInputError): tensors on a device other than cpu or cuda.
        OSError: the swap file cannot be made or written (raised by the forward pass, or
            by backward for a failed read).
    """

    def __init__(
        self,
        dir: str | os.PathLike[str] | None = None,  # noqa: A002 (the issue's name)
        budget_bytes: int = _DEFAULTS["budget"],
        min_bytes: int = _DEFAULTS["small_threshold"],
        prefetch: int | None = None,
        *,
        io_threads: int = _DEFAULTS["io_threads"],
        write_behind: int | None = None,
        pack: bool = _DEFAULTS["pack"],
        caching_allocator: bool = True,
        release_memory: bool = False,
        device_path: str = _DEFAULTS["device_path"],
        engine: Engine | None = None,
    ):
        if budget_bytes <= 0:
            raise _invalid(f"fastensor offload: budget_bytes must be positive, not {budget_bytes}")
        if prefetch is not None and prefetch < 0:
            raise _invalid(f"fastensor offload: prefetch must be >= 0, not {prefetch}")
        self.dir = os.fspath(dir) if dir is not None else _default_dir()
        self.budget_bytes = int(budget_bytes)
        self.min_bytes = max(1, int(min_bytes))
        self.prefetch = prefetch
        self.io_threads = io_threads
        if write_behind is not None and write_behind < 0:
            raise _invalid(f"fastensor offload: write_behind must be >= 0, not {write_behind}")
        self.write_behind = write_behind
        self.pack = bool(pack)
        self.caching_allocator = caching_allocator
        self.release_memory = release_memory
        try:
            self.device_path = _native.parse_device_path(device_path)
        except ValueError as exc:
            raise _invalid(f"fastensor offload: {exc}") from None
        self.engine = engine
        self._session: _Session | None = None
        self._hooks: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> OffloadStats:
        if self._session is not None:
            raise RuntimeError("fastensor offload: this block is already active")
        fs = _native.fs_type(self.dir)
        if fs in ("tmpfs", "ramfs"):
            warnings.warn(
                f"fastensor offload: {self.dir} is in memory ({fs}); offloaded "
                "tensors still take RAM there (pass dir= or set FASTENSOR_OFFLOAD_DIR)",
                stacklevel=2,
            )
        allocator: tuple = (None, "not asked for (caching_allocator=False)")
        if self.caching_allocator:
            allocator = _allocator_enable(min(self.min_bytes, _POOL_MIN_BYTES))
        if allocator[0] is None and self.release_memory:
            release_freed_memory(self.min_bytes)
        depth = _UNLIMITED if self.prefetch is None else self.prefetch
        hint_key = os.path.realpath(self.dir)
        try:
            store = _native.OffloadStore(
                engine_or_default(self.engine),
                self.dir,
                self.budget_bytes,
                prefetch_depth=depth,
                io_threads=self.io_threads,
                initial_capacity=_capacity_hints.get(hint_key, 0),
                device_path=self.device_path,
                write_behind=self.write_behind,
                pack=self.pack,
            )
        except BaseException:
            _allocator_disable(allocator[0])
            raise
        session = _Session(
            store, self.min_bytes, depth, allocator, hint_key, gpu_keep_bytes=self.budget_bytes
        )
        self._hooks = torch.autograd.graph.saved_tensors_hooks(session.pack, session.unpack)
        self._hooks.__enter__()
        self._session = session
        return session.stats

    def __exit__(self, *exc: object) -> None:
        session, self._session = self._session, None
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.__exit__(*exc)
        if session is not None and not session.store.closed:
            session.confirm_writes()
            # The forward pass is over: read back, in backward order, what backward needs
            # first, while the caller computes its loss and starts backward.
            session.store.expect_backward()
        # From here, the session lives as long as the graphs that hold its records.
        del session
