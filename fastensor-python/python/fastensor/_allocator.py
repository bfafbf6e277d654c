"""A caching allocator for torch's large CPU tensors: :class:`caching_allocator`, opt-in.

torch gets a CPU tensor's memory from glibc. Blocks of a MiB or more are then mappings of
their own, or glibc hands freed ones back to the system, so every training step faults its
activations in again (page faults cost 1-2 CPU seconds per GiB on some virtual machines,
often more than the step's compute). Activation offload makes it worse: it frees each
activation as soon as it is written. Inside ``with caching_allocator():`` torch's requests
of at least ``min_bytes`` come from a pool of page-aligned blocks instead, and blocks torch
frees go back to it for the next request of about the same size, as torch's CUDA caching
allocator does on a GPU. :func:`fastensor.torch.offload` uses it only when asked
(``offload(..., caching_allocator=True)``), for as long as its graphs live.

What it buys: less resident memory and faster steps (blocks reused, already faulted in; an
offloaded tensor is written straight from its block). What it costs: while in use,
``libc10.so``'s global offset table entries of ``posix_memalign``, ``free`` and ``realloc``
are rewritten (as memory profilers do) so that torch's calls reach the pool; calls from any
other library are untouched.

Who owns what: the pool owns its blocks; a tensor owns one from its allocation to its free.
Idle blocks are kept up to half again the most the pool had handed out at once, until
:func:`empty_cache` releases them.

Its life: the first user (a ``caching_allocator`` block, an offload session) rewrites the
entries; more users only count. When the last user leaves, the original entries and their
pages' protection (read-only RELRO) are put back, at once if no tensor holds a pool block,
else by the ``free`` of the last such block (until then the pool serves no new request:
torch allocates from glibc again, and only the blocks still out come back through the
redirection, since glibc's ``free`` must never see one). ``FASTENSOR_TORCH_ALLOCATOR=0`` in
the environment turns it off whatever the code asks.
"""

from __future__ import annotations

import os
from typing import Any

from . import _native

__all__ = ["allocator_stats", "caching_allocator", "empty_cache"]

#: The environment variable that turns the allocator off (``0``).
ENV_SWITCH = "FASTENSOR_TORCH_ALLOCATOR"


def _switched_off() -> bool:
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("0", "false", "no", "off")


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

    Blocks freed after the block are still taken back by the pool; ``libc10.so``'s calls
    are given back to glibc when the last user has left and the last pool block is freed
    (see the module's documentation). ``enabled`` tells whether it took effect; ``reason``
    why not (``FASTENSOR_TORCH_ALLOCATOR=0``, or no ``libc10.so`` to redirect: then torch
    allocates as usual).

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
    """The pool's figures: ``installed`` (``libc10.so``'s calls redirected now),
    ``redirected_slots``, ``installs``/``removals`` (times the redirection was put in place
    and undone), ``reason`` (why the last install or removal failed, if one did), ``stuck``
    (a removal failed: the allocator stays off in this process), ``enabled`` (a user has it
    on), ``min_bytes``, ``blocks_held`` and ``live_bytes`` (held by tensors),
    ``idle_bytes`` (kept for reuse), ``peak_live_bytes``, ``hits`` (requests served by an
    idle block), ``misses`` (new blocks), ``released_blocks``/``released_bytes``,
    ``fallbacks`` (requests glibc served because the pool could not)."""
    return dict(_native.torch_allocator_stats())
