"""A caching allocator for torch's large CPU tensors: :class:`caching_allocator`.

torch gets a CPU tensor's memory from glibc. Blocks of a MiB or more are then mappings of
their own, or glibc hands freed ones back to the system, so every training step faults its
activations in again (page faults can cost more than the step's compute on virtual
machines: docs/lab/cold-start.md), and memory freed by tensors of one size does not serve
another. Inside ``with caching_allocator():`` torch's requests of at least ``min_bytes``
come from fastensor's pool of page-aligned blocks instead, as torch's CUDA caching allocator
does on a GPU: a freed block serves the next request of about its size, and idle blocks of
other sizes have their pages moved (not copied, not faulted again) into a block of the size
asked for, so the pool never holds more than the most its users had at once.
:func:`fastensor.torch.offload` uses it by default, for as long as its graphs live, and
reads offloaded tensors back into the same pool.

How: through torch's own CPU allocator slot (``c10::SetCPUAllocator``, the C++ API torch
offers for this), with an allocator object built from what the loaded ``libc10.so``
exports and checked against it first; where it does not match, or another allocator holds
the slot, torch keeps its own and ``reason`` says why. No other library's allocations are
affected.

Who owns what: the pool owns its blocks; a tensor owns one from its allocation to its
free, and the block's deleter gives it back to the pool whatever allocator torch has by
then. Idle blocks are kept (what the users had at their peak) until :func:`empty_cache`
releases them.

Its life: the first user installs the allocator; more users only count; when the last user
leaves, torch's own allocator serves every request again at once. The allocator object stays
in torch's slot, passing requests through: memory handed out by ``raw_allocate`` (MKLDNN
tensors, through ideep) is freed through whichever allocator holds the slot when it is
freed, and only fastensor's tells a pool block, made inside the window and freed after it,
from torch's own memory. ``FASTENSOR_TORCH_ALLOCATOR=0`` in the environment turns it off
whatever the code asks.
"""

from __future__ import annotations

import os
from typing import Any

from . import _native

__all__ = ["allocator_stats", "caching_allocator", "empty_cache", "release_freed_memory"]

#: The environment variable that turns the allocator off (``0``).
ENV_SWITCH = "FASTENSOR_TORCH_ALLOCATOR"


def _switched_off() -> bool:
    return _native.parse_flag(os.environ.get(ENV_SWITCH, "")) is False


def _enable(min_bytes: int) -> tuple[int | None, str | None]:
    """Enables the pool for requests of ``min_bytes`` or more: ``(token, None)``, or
    ``(None, reason)`` where it cannot be (turned off, or no ``libc10.so`` to redirect)."""
    if _switched_off():
        return None, f"turned off by {ENV_SWITCH}"
    import torch  # noqa: F401 (libc10.so must be loaded to be redirected)

    try:
        return _native.torch_allocator_enable(int(min_bytes)), None
    except RuntimeError as e:
        return None, str(e)


def _disable(token: int | None) -> None:
    if token is not None:
        _native.torch_allocator_disable(token)


class caching_allocator:  # noqa: N801 (a context manager named as a function, like torch.no_grad)
    """Serves torch's CPU allocations of at least ``min_bytes`` from fastensor's pool of
    reusable page-aligned blocks while the block runs (and frees them back to it)::

        with fastensor.torch.caching_allocator():
            for x, y in batches:
                loss = model(x).loss
                loss.backward()

    Blocks freed after the block are still taken back by the pool; torch's own allocator
    serves every request once the last user has left (see the module's documentation). ``enabled``
    tells whether it took effect; ``reason`` why not (``FASTENSOR_TORCH_ALLOCATOR=0``, or a
    torch whose allocator cannot be replaced: then torch allocates as usual).

    Args:
        min_bytes: smallest request served from the pool (default 1 MiB); smaller ones stay
            with glibc, whose heap serves them well.
    """

    def __init__(self, min_bytes: int = 1 << 20):
        if min_bytes <= 0:
            raise ValueError(f"caching_allocator: min_bytes must be positive, not {min_bytes}")
        self.min_bytes = int(min_bytes)
        self.enabled = False
        self.reason: str | None = None
        self._token: int | None = None

    def __enter__(self) -> caching_allocator:
        if self._token is not None:
            raise RuntimeError("caching_allocator: this block is already active")
        self._token, self.reason = _enable(self.min_bytes)
        self.enabled = self._token is not None
        return self

    def __exit__(self, *exc: object) -> None:
        token, self._token = self._token, None
        _disable(token)


def empty_cache() -> int:
    """Releases the pool's idle blocks to the system (the blocks tensors hold stay); returns
    the bytes released. Like ``torch.cuda.empty_cache``."""
    return int(_native.torch_allocator_trim())


def allocator_stats() -> dict[str, Any]:
    """The pool's figures: ``installed`` (the pool serves torch's CPU allocations now),
    ``installs``/``removals`` (times it was put in place and taken out), ``reason`` (why it
    could not be installed, if it could not), ``enabled`` (a user has it on), ``min_bytes``,
    ``blocks_held`` and ``live_bytes`` (held by tensors and reads back), ``idle_bytes``
    (kept for reuse), ``peak_bytes`` (the most the pool held), ``reused`` (requests served
    by an idle block), ``remapped``/``remapped_bytes`` (requests served by moving idle pages),
    ``fresh``/``fresh_bytes`` (fresh memory taken), ``released_bytes`` (given back by
    :func:`empty_cache`), ``fallbacks`` (requests torch's allocator served because the pool
    could not)."""
    return dict(_native.torch_allocator_stats())


#: The most glibc accepts as its mmap threshold (64-bit).
_MMAP_THRESHOLD_MAX = 32 << 20

#: The mmap threshold this module set (None: malloc left alone so far).
_mmap_threshold: int | None = None


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
