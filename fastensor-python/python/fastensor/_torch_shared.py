"""Tensors that share memory (tied weights), found as ``safetensors.torch`` finds them: below
the save checks and ``save_model``/``load_model``, which name and drop them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import torch


def storage_ptr(t: torch.Tensor) -> int:
    """The address of the storage ``t`` views (0 for a tensor without one, e.g. meta)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0  # (meta tensors have no storage to share)


def storage_size(t: torch.Tensor) -> int:
    """The bytes of the storage ``t`` views."""
    try:
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return t.nelement() * t.element_size()


def _end_ptr(t: torch.Tensor) -> int:
    """The address just past the last element of ``t`` (strides followed; any layout)."""
    if t.nelement():
        last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        return t.data_ptr() + (last + 1) * t.element_size()
    return t.data_ptr()


def _find_shared_tensors(state: Mapping[str, torch.Tensor]) -> list[set[str]]:
    """Groups of names whose tensors overlap in memory (one name alone where none does)."""
    by_storage: dict[tuple, set[str]] = defaultdict(set)
    for k, v in state.items():
        if v.device.type != "meta" and storage_ptr(v) != 0 and storage_size(v) != 0:
            by_storage[(v.device, storage_ptr(v), storage_size(v))].add(k)
    groups = []
    for shared in sorted(by_storage.values()):
        if len(shared) < 2:
            groups.append(shared)
            continue
        areas = sorted((state[n].data_ptr(), _end_ptr(state[n]), n) for n in shared)
        _, last_stop, last_name = areas[0]
        groups.append({last_name})
        for start, stop, name in areas[1:]:
            if start >= last_stop:
                groups.append({name})
            else:
                groups[-1].add(name)
            last_stop = stop
    return groups


def _is_complete(t: torch.Tensor) -> bool:
    return t.data_ptr() == storage_ptr(t) and t.nelement() * t.element_size() == storage_size(t)
