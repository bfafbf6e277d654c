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

import contextlib
import os
import tempfile
import warnings
from typing import Any

import torch

from . import _native
from ._allocator import _disable as _allocator_disable
from ._allocator import _enable as _allocator_enable
from ._allocator import release_freed_memory
from ._engine import Engine, engine_or_default
from ._offload import _capacity_hints, _Session
from ._offload_stats import OffloadStats
from .errors import _invalid

__all__ = ["OffloadStats", "offload", "release_freed_memory"]

#: The defaults of offload: Rust's table (``fastensor::offload::defaults``), one for both.
_DEFAULTS: dict[str, Any] = _native.OFFLOAD_DEFAULTS

#: Prefetch depth standing for "as many tensors as the budget holds".
_UNLIMITED: int = _DEFAULTS["prefetch_as_budget_holds"]

#: torch's CPU requests of at least this many bytes come from the pool while offload runs.
_POOL_MIN_BYTES: int = _DEFAULTS["pool_min_bytes"]


def _default_dir() -> str:
    """``$FASTENSOR_OFFLOAD_DIR``, else the system's temporary directory."""
    return os.environ.get("FASTENSOR_OFFLOAD_DIR") or tempfile.gettempdir()


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
        device_write_behind: most bytes of the last CUDA tensors saved that stay in their own
            device memory, per device: backward takes them first, in place, with no copy;
            older ones are copied out and written, oldest first, by the pack that passes
            the limit. ``None`` (default): ``budget_bytes``; ``0``: every CUDA tensor is
            copied out as soon as it is saved.
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
        device_write_behind: int | None = None,
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
        if device_write_behind is not None and device_write_behind < 0:
            raise _invalid(
                f"fastensor offload: device_write_behind must be >= 0, not {device_write_behind}"
            )
        self.device_write_behind = device_write_behind
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
                device_write_behind=self.device_write_behind,
                pack=self.pack,
            )
        except BaseException:
            _allocator_disable(allocator[0])
            raise
        session = _Session(store, self.min_bytes, depth, allocator, hint_key)
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
