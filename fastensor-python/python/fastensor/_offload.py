"""The hook glue of :func:`fastensor.torch.offload` (``_offload_block.py``, which says who
owns what): a session per block, its ``pack`` and ``unpack`` hooks for
``torch.autograd.graph.saved_tensors_hooks``, and the record of each offloaded storage.
Every byte moves in the native ``OffloadStore``; this module decides what to hand it and
rebuilds the saved tensors from what comes back."""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import os
import threading
import time
import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ._allocator import _disable as _allocator_disable
from ._offload_stats import OffloadStats
from .errors import FileChangedError, _invalid

#: The swap file size the last block in each directory needed: the next block's store
#: reserves it at once (growing a swap file while writes are in flight waits for them).
_capacity_hints: dict[str, int] = {}

_live_sessions: weakref.WeakSet[_Session] = weakref.WeakSet()
_live_lock = threading.Lock()


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
        #: The original storage, weakly: a dead one means its address may be reused.
        self.source = source
        #: The original storage's Python object, weakly: alive while the store still holds
        #: it (a CPU storage until written, a CUDA one until copied out: the last ones saved
        #: stay on their device) or something else does; unpack then takes it as it is.
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
        """The store's figures as Rust names them (``OffloadStats``), then the hooks' own."""
        if not self.store.closed:
            self._native = self.store.stats()
            # After the figures: a write they count as done is seen finished.
            self.confirm_writes()
        out: dict[str, Any] = dict(getattr(self, "_native", None) or {})
        out.update(self.counts)
        out["unpack_stall_s"] = self.unpack_stall_s
        out["swap_path"] = self.swap_path
        out["devices"] = {k: dict(v) for k, v in self.per_device.items()}
        out["caching_allocator"] = self.allocator_token is not None
        out["caching_allocator_reason"] = self.allocator_reason
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
            # Handed over with the stream handshake: no wait for the device here. The store
            # keeps the last ones saved on their device, as they are.
            handle = self.store.put_device(flat, f"saved{next(self.labels)}")
            self._device_figures(dev)["bytes_offloaded"] += nbytes
            rec = _Record(self, handle, source, dev, nbytes)
            rec.original = weakref.ref(storage)
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

    def unpack(self, p: torch.Tensor | _Packed) -> torch.Tensor:
        """The saved tensor back: ``p`` itself, or rebuilt from the bytes read back."""
        if isinstance(p, torch.Tensor):
            return p
        rec, dtype, size, stride, offset = p
        self.counts["unpacks"] += 1
        self.confirm_writes()
        storage = rec.restored
        if storage is None:
            storage = rec.in_memory()
            if storage is not None:
                # Still in memory (not written or copied out yet, or held elsewhere): no
                # read at all.
                self.store.discard(rec.handle)
                self.counts["restored_in_place"] += 1
                if rec.device.type == "cuda":
                    self._device_figures(rec.device)["bytes_kept_on_device"] += rec.nbytes
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
