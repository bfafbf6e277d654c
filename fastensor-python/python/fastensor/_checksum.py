"""Per-tensor checksums: stamped into a save's metadata (``checksum=True``) and checked on
loads (``verify=True``), the bytes hashed in Rust.

The file stays a plain safetensors file: the checksums are one ``__metadata__`` entry,
:data:`CHECKSUMS_KEY` (``"fastensor.checksums"``), a JSON map of each tensor's name to the
CRC-32C of its bytes as 8 hex digits. A verified load checks each tensor on the I/O thread
that read it, right after its bytes arrive, and raises
:class:`~fastensor.errors.CorruptError` naming the file and the tensor on a mismatch. A part
of a tensor (a slice) cannot be checked on its own: with ``verify=True``, ``get_slice`` reads
the whole tensor, checks it, and slices it in memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import _native

#: The ``__metadata__`` key of the checksums (the Rust checkpoint code's).
CHECKSUMS_KEY: str = _native.CHECKSUMS_KEY


def stamp(specs: Sequence[tuple[str, str, Any, Any]], metadata: Mapping[str, str] | None):
    """``metadata`` with the checksums of the save specs ``specs`` (host memory) added
    under :data:`CHECKSUMS_KEY`."""
    out = dict(metadata or {})
    out[CHECKSUMS_KEY] = _native.checksums(list(specs))
    return out


def open_file(engine: _native.Engine, path: str, verify: bool):
    """The native open file of ``path``, its reads verified when ``verify``.

    Raises:
        ValueError (InvalidInputError): with ``verify``, a file saved without checksums.
    """
    return _native.open_verified(engine, path) if verify else engine.open(path)


def open_any(engine: _native.Engine, path: str, verify: bool = False):
    """A sharded checkpoint's open file for a directory or an index, else the file's; with
    ``verify``, its reads are checked against the checksums saved with it."""
    if _native.is_sharded(path):
        return _native.open_sharded(engine, path, verify)
    return open_file(engine, path, verify)


def verify_file(path, *, engine=None) -> tuple[int, int]:
    """Checks every tensor of the safetensors file ``path`` against the checksums saved with
    it, without loading it (as ``fastensor ckpt verify`` does); returns ``(tensors,
    bytes)`` checked.

    Raises:
        ValueError (CorruptError): a tensor whose bytes changed, or a truncated file; the
            message names the file and the tensor.
        ValueError (InvalidInputError): the file was saved without checksums.
    """
    from ._common import fspath
    from ._engine import engine_or_default

    return _native.verify_file(engine_or_default(engine), fspath(path))


def load_torch_verified(engine: _native.Engine, path: str, device) -> dict[str, Any]:
    """Every tensor of ``path`` read into new host memory through a verified open file
    (each checked as it arrives), then moved to ``device``."""
    import torch

    from ._host_load import read_host

    out = read_host(_native.open_verified(engine, path), path)
    if torch.device(device).type != "cpu":
        out = {k: v.to(device) for k, v in out.items()}
    return out
