"""The figures of an offload block: :class:`OffloadStats`, read live from its session while
the store is open, kept once it closed."""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Protocol


class _Figures(Protocol):
    def figures(self) -> dict[str, Any]: ...


def _field(name: str, doc: str) -> property:
    return property(lambda self: self.as_dict()[name], doc=doc)


class OffloadStats:
    """What an :func:`offload` block did; read it any time (live while its store is open,
    the final figures after it closed). Bytes are ints, times seconds."""

    def __init__(self, session: _Figures):
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
    put_wait_s = _field("put_wait_s", "Time pack waited for room in the store's budget (forward).")
    write_time_s = _field("write_time_s", "Time the I/O threads spent writing.")
    read_time_s = _field("read_time_s", "Time spent reading back (prefetch and on demand).")
    prefetches = _field("prefetches", "Reads started ahead of their unpack.")
    gets_from_memory = _field(
        "gets_from_memory", "Reads back answered from memory (prefetched or still there)."
    )
    swap_path = _field("swap_path", "The swap file's path.")
    devices = _field(
        "devices",
        "Per CUDA device (``'cuda:0'``...): bytes offloaded, bytes backward took from their "
        "own device memory (the last ones saved, never copied out: ``device_write_behind``), "
        "and the time unpack waited.",
    )
    device_unwritten_bytes = _field(
        "device_unwritten_bytes",
        "Bytes of CUDA tensors the store keeps in their own device memory now.",
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
    def pack_wait_s(self) -> float:
        """Deprecated name of :attr:`put_wait_s`."""
        warnings.warn(
            "OffloadStats.pack_wait_s is put_wait_s (the store's name for it)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.put_wait_s

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
