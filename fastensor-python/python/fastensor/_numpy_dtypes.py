"""NumPy's dtypes and their safetensors names (below :mod:`fastensor.numpy` and the
``safe_open`` slices that make numpy arrays)."""

from __future__ import annotations

import numpy as np

#: numpy dtype -> safetensors dtype name (the dtypes numpy has).
TO_NAME = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "U8",
    np.dtype(np.int8): "I8",
    np.dtype(np.int16): "I16",
    np.dtype(np.uint16): "U16",
    np.dtype(np.float16): "F16",
    np.dtype(np.int32): "I32",
    np.dtype(np.uint32): "U32",
    np.dtype(np.float32): "F32",
    np.dtype(np.int64): "I64",
    np.dtype(np.uint64): "U64",
    np.dtype(np.float64): "F64",
    np.dtype(np.complex64): "C64",
}
#: safetensors dtype name -> numpy dtype.
FROM_NAME = {v: k for k, v in TO_NAME.items()}
