"""The memory of a tensor lent to a save, held in place until the save is done.

A save lends the native module each tensor's memory as it is (no copy) and writes it with
the GIL released. Meanwhile another thread may give the tensor new memory: ``resize_`` to a
larger size, ``untyped_storage().resize_``, ``share_memory_``. Each replaces the memory of
the tensor's storage and frees the old: the memory the export pointed to (a DLPack capsule
keeps the storage object alive, not the memory it held when exported), and a read of freed
memory may be a segmentation fault.

:func:`held` hands the save a copy-on-write clone of the tensor instead
(``torch._lazy_clone``): no byte is copied; the clone and the tensor share the memory under
one reference count, and the memory is freed only when both have let go of it. A resize of
the tensor during the save gives the tensor new memory and leaves the clone's in place;
a write to the tensor during the save (or anything that takes its memory for writing, such
as ``data_ptr()`` or ``numpy()``) first copies it for the tensor; either way the save reads
the bytes the tensor held when the save began, and reads of the tensor copy nothing. The
native module exports the clone read-only (DLPack's ``read_only``), so torch exports it as
it is rather than copying it. When the save returns and drops the clone, the tensor is the
memory's only owner again: its next write copies nothing.

Memory torch does not own (a numpy array, a buffer, a file mapped by a load) has a storage
that cannot be resized, so nothing can move it: it is lent as it is. So is host memory
torch cannot share copy-on-write (a tensor moved to shared memory, which ``resize_`` cannot
grow without crashing torch itself), device memory (a resize frees it into torch's caching
allocator, not to the driver, unless ``torch.cuda.empty_cache()`` runs meanwhile), and every
tensor under a torch without ``torch._lazy_clone`` or a read-only DLPack export (resizing a
tensor during a save is then unsafe, as docs/reliability.md says).
"""

from __future__ import annotations

import contextlib
import inspect

import torch

from .errors import _invalid


def _supported() -> bool:
    if not hasattr(torch, "_lazy_clone"):
        return False
    try:
        return "read_only" in inspect.signature(torch.Tensor.__dlpack__).parameters
    except (TypeError, ValueError):
        return False


_SUPPORTED = _supported()


def held(t: torch.Tensor, path: str, what: str) -> torch.Tensor:
    """What a save to ``path`` of ``t`` (a contiguous tensor the caller owns; ``what`` names
    it) lends: a copy-on-write clone of ``t`` where its memory could be freed during the
    save, else ``t`` (see the module).

    Raises:
        ValueError (InvalidInputError): the tensor's storage holds fewer bytes than its
            shape covers (its storage was resized to less, as FSDP frees parameters):
            lent, it would be read past its end.
    """
    out = t
    if _SUPPORTED and t.device.type == "cpu" and t.untyped_storage().resizable():
        with contextlib.suppress(RuntimeError):  # memory torch cannot share copy-on-write
            out = torch._lazy_clone(t)
    # (the clone's storage keeps the size it had when cloned)
    needed = (out.storage_offset() + out.numel()) * out.element_size()
    has = out.untyped_storage().nbytes()
    if out.numel() and has < needed:
        raise _invalid(
            f"{path}: {what} covers {needed} bytes of its storage, which holds {has} (was the"
            " storage resized?)",
            path,
        )
    return out
