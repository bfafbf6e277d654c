"""torch dtypes <-> safetensors dtype names, and the shapes of packed dtypes.

Every dtype both know, where this torch has it: the integers of every width, ``BOOL``, the
floats (``F16``, ``BF16``, ``F32``, ``F64``), ``C64`` (``complex64``) and the 8-bit floats
(``F8_E4M3``, ``F8_E5M2``, their ``FNUZ`` forms, ``F8_E8M0``), and ``F4`` as torch's packed
``float4_e2m1fn_x2``: one torch element holds two ``F4`` values, so the header holds the
logical shape, the torch tensor's with its last dimension doubled (as safetensors writes it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import unknown_dtype
from .errors import _invalid


def _table() -> dict[torch.dtype, str]:
    table = {
        torch.bool: "BOOL",
        torch.uint8: "U8",
        torch.int8: "I8",
        torch.int16: "I16",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.int32: "I32",
        torch.float32: "F32",
        torch.complex64: "C64",
        torch.int64: "I64",
        torch.float64: "F64",
    }
    # Newer dtypes, where this torch has them.
    for attr, name in (
        ("float8_e5m2", "F8_E5M2"),
        ("float8_e4m3fn", "F8_E4M3"),
        ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
        ("float8_e4m3fnuz", "F8_E4M3FNUZ"),
        ("float8_e8m0fnu", "F8_E8M0"),
        ("float4_e2m1fn_x2", "F4"),
        ("uint16", "U16"),
        ("uint32", "U32"),
        ("uint64", "U64"),
    ):
        dt = getattr(torch, attr, None)
        if dt is not None:
            table[dt] = name
    return table


#: torch dtype -> safetensors name.
TO_NAME: dict[torch.dtype, str] = _table()
#: safetensors name -> torch dtype.
FROM_NAME: dict[str, torch.dtype] = {v: k for k, v in TO_NAME.items()}

#: The safetensors dtypes torch packs two to an element (the header's last dimension is
#: twice torch's).
PACKED = frozenset({"F4"})


def header_shape(t: torch.Tensor, dtype: str, where: str, name: str) -> list[int]:
    """The shape the header records for ``t`` of safetensors dtype ``dtype``: ``t``'s, with
    the last dimension doubled for a packed dtype.

    Raises:
        ValueError (InvalidInputError): a 0-d tensor of a packed dtype (two values with no
            dimension to hold them).
    """
    shape = list(t.shape)
    if dtype in PACKED:
        if not shape:
            raise _invalid(
                f"{where}: tensor `{name}` is a 0-d {t.dtype}, which holds two {dtype} values:"
                " give it a dimension (e.g. `.reshape(1)`) to save it",
                where,
            )
        shape[-1] *= 2
    return shape


def torch_shape(dtype: str, shape: Sequence[int]) -> list[int]:
    """The torch shape of a tensor the header records as ``dtype`` × ``shape``: the same,
    with the last dimension halved for a packed dtype.

    Raises:
        ValueError (InvalidInputError): a packed tensor whose last dimension is odd (or that
            has none): torch cannot hold it.
    """
    shape = list(shape)
    if dtype in PACKED:
        if not shape or shape[-1] % 2:
            raise _invalid(
                f"{FROM_NAME.get(dtype, dtype)} holds {dtype} values in pairs: the shape"
                f" {shape} needs an even last dimension"
            )
        shape[-1] //= 2
    return shape


def torch_dtype(path: str, name: str, dtype: str) -> torch.dtype:
    """The torch dtype of safetensors dtype ``dtype`` (tensor ``name`` of ``path``); one this
    torch lacks is an error naming the file and the tensor."""
    dt = FROM_NAME.get(dtype)
    if dt is None:
        raise unknown_dtype(path, name, dtype, f"torch {torch.__version__}")
    return dt
