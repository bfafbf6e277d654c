"""What a save refuses before it starts, with the exception types ``safetensors.torch``
raises and, where it words them exactly, its words: tensors not in a dict, values that are
not tensors, sparse tensors, meta tensors (no data), and tensors that share memory."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ._torch_shared import _end_ptr, _find_shared_tensors
from .errors import NoDataError, SharedTensorsError, WrongTypeError, _invalid

_SPARSE = {
    getattr(torch, name)
    for name in ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
    if hasattr(torch, name)
}


def _check_shared(tensors: Mapping[str, torch.Tensor], path: str) -> None:
    """Refuses tensors whose memory overlaps (sorted by address: no pairwise search)."""
    spans = []
    for name, t in tensors.items():
        # (nested and other layouts are refused by name later)
        if t.is_nested or t.layout != torch.strided or t.numel() == 0:
            continue
        start = t.data_ptr()
        spans.append((t.device.type, t.device.index or 0, start, _end_ptr(t), name))
    spans.sort()
    overlap = any(a[:2] == b[:2] and b[2] < a[3] for a, b in zip(spans, spans[1:], strict=False))
    if not overlap:
        return
    groups = [sorted(g) for g in _find_shared_tensors(dict(tensors)) if len(g) > 1]
    exc = SharedTensorsError(
        f"{path}: some tensors share memory: {groups}; saved apart they would be duplicated on"
        " disk and no longer shared when loaded. Save one name of each group, or use"
        " `fastensor.torch.save_model`, which records the others in the metadata."
    )
    exc.path = path
    raise exc


def check_savable(tensors: object, path: str) -> None:
    """Refuses what ``safetensors.torch.save_file`` refuses, before anything is written.

    Raises:
        TypeError and ValueError (WrongTypeError): ``tensors`` is not a dict, a name is not a
            str, or a value is not a ``torch.Tensor``.
        ValueError (InvalidInputError): sparse tensors.
        RuntimeError and ValueError (NoDataError): a meta tensor (it has no data).
        RuntimeError (SharedTensorsError): tensors that share memory.
    """
    if not isinstance(tensors, Mapping):
        raise _invalid(
            f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}",
            path,
            WrongTypeError,
        )
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise _invalid(
                f"{path}: tensor names must be str, got {type(k).__name__} ({k!r})",
                path,
                WrongTypeError,
            )
        if not isinstance(v, torch.Tensor):
            raise _invalid(
                f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}",
                path,
                WrongTypeError,
            )
    sparse = [k for k, v in tensors.items() if v.layout in _SPARSE]
    if sparse:
        raise _invalid(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not"
            " support. You can make it a dense tensor before saving with `.to_dense()` but be"
            " aware this might make a much larger file than needed.",
            path,
        )
    for k, v in tensors.items():
        if v.device.type == "meta" and not v.is_nested:
            raise _invalid(
                f"{path}: Cannot copy out of meta tensor `{k}`: a meta tensor has no data to save",
                path,
                NoDataError,
            )
    _check_shared(tensors, path)
