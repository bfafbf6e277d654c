"""fastensor: tensors between SSD files and memory through the fastest I/O path.

Checkpoints are safetensors files, saved durably and atomically and loaded at the disk's
speed by a Rust engine that picks the I/O path (page cache, ``O_DIRECT``, mmap, io_uring,
GPUDirect Storage) per transfer and learns which one wins.

* :mod:`fastensor.torch`: ``save_file``, ``load_file``, ``load_into``, ``safe_open``,
  ``save_file_async`` for PyTorch (names as in ``safetensors.torch``).
* :mod:`fastensor.numpy`: ``save_file``, ``load_file``, ``safe_open`` for NumPy.
* :func:`serialize`, :func:`serialize_file`, :func:`deserialize` (with :class:`TensorSpec`):
  framework-free, as in ``safetensors``; :class:`SafetensorError` is what code written for
  ``safetensors`` catches.
* :func:`verify_file`: a file's tensors checked against the checksums saved with it
  (``save_file(..., checksum=True)``), without loading it.
* :class:`Engine` and :func:`backends` for control over the I/O paths.

``import fastensor`` needs neither torch nor numpy.
"""

from __future__ import annotations

import os as _os

from . import _native, errors
from ._bytes import TensorSpec, deserialize, serialize, serialize_file
from ._checksum import verify_file
from ._engine import Backend, Engine, backends, default_engine
from ._native import SaveHandle, __version__
from .errors import CorruptError, FastensorError, SafetensorError

# A loaded model stays loaded in a child of `os.fork` (multiprocessing, DataLoader workers,
# preforking servers) too: each read lease of this process gets one for the child, taken
# before the fork, which the child makes its own (fastensor_sys::lease::inherit).
_os.register_at_fork(
    before=_native.leases_before_fork,
    after_in_parent=_native.leases_after_fork_in_parent,
    after_in_child=_native.leases_after_fork_in_child,
)


def safe_open(filename, framework: str = "pt", device: str = "cpu", **kwargs):
    """Opens a safetensors file for reads on demand, as ``safetensors.safe_open`` does:
    ``framework="pt"`` gives torch tensors (:class:`fastensor.torch.safe_open`),
    ``"np"`` numpy arrays (:class:`fastensor.numpy.safe_open`)."""
    if framework in ("pt", "torch", "pytorch"):
        from .torch import safe_open as opener
    elif framework in ("np", "numpy"):
        from .numpy import safe_open as opener
    else:
        raise ValueError(f"safe_open: unknown framework {framework!r} (use 'pt' or 'np')")
    return opener(filename, framework=framework, device=device, **kwargs)


__all__ = [
    "Backend",
    "CorruptError",
    "Engine",
    "FastensorError",
    "SafetensorError",
    "SaveHandle",
    "TensorSpec",
    "__version__",
    "backends",
    "default_engine",
    "deserialize",
    "errors",
    "safe_open",
    "serialize",
    "serialize_file",
    "verify_file",
]
