"""The exceptions fastensor raises.

Every error is a :class:`FastensorError` and also the builtin exception callers already
catch: a missing file is a :class:`FileNotFoundError`, a corrupt file or a bad argument a
:class:`ValueError`, a full disk an :class:`OSError`, and so on. Each carries the ``path``,
``offset`` and ``backend`` the error happened at, where known.
"""

from __future__ import annotations

import errno as _errno

__all__ = [
    "FastensorError",
    "NotFoundError",
    "PermissionDeniedError",
    "AlreadyExistsError",
    "UnavailableError",
    "UnsupportedError",
    "InvalidInputError",
    "CorruptError",
    "StorageFullError",
    "OutOfMemoryError",
    "DeviceError",
    "FastensorIOError",
    "FileChangedError",
]


class FastensorError(Exception):
    """Base class of every fastensor error.

    Attributes:
        kind: the error's category, e.g. ``"corrupt"`` or ``"not_found"``.
        path: the file the error concerns, or ``None``.
        offset: the byte offset in that file, or ``None``.
        backend: the I/O backend that failed, or ``None``.
    """

    kind: str = "other"
    path: str | None = None
    offset: int | None = None
    backend: str | None = None

    def __str__(self) -> str:
        # The message already names the file; OSError's "[Errno N] ...: 'path'" would
        # repeat it.
        return str(self.args[0]) if self.args else ""


class NotFoundError(FastensorError, FileNotFoundError):
    """A file, tensor or backend that was asked for does not exist."""

    kind = "not_found"


class PermissionDeniedError(FastensorError, PermissionError):
    """The operating system refused access."""

    kind = "permission_denied"


class AlreadyExistsError(FastensorError, FileExistsError):
    """Something that must be new already exists."""

    kind = "already_exists"


class UnavailableError(FastensorError, RuntimeError):
    """A backend cannot run on this machine (missing library or kernel feature)."""

    kind = "unavailable"


class UnsupportedError(FastensorError, RuntimeError):
    """The operation is not supported here (e.g. GPU memory without a CUDA backend)."""

    kind = "unsupported"


class InvalidInputError(FastensorError, ValueError):
    """An argument is wrong: a dtype, a shape, a name, a path that is not a file."""

    kind = "invalid_input"


class CorruptError(FastensorError, ValueError):
    """A file's content is not what the safetensors format promises (or it is truncated)."""

    kind = "corrupt"


class StorageFullError(FastensorError, OSError):
    """The file system is full or a quota is exhausted."""

    kind = "storage_full"


class OutOfMemoryError(FastensorError, MemoryError):
    """Memory could not be allocated."""

    kind = "out_of_memory"


class DeviceError(FastensorError, RuntimeError):
    """A GPU or driver call failed."""

    kind = "device"


class FastensorIOError(FastensorError, OSError):
    """Any other operating-system I/O error."""

    kind = "io"


class FileChangedError(FastensorError, OSError):
    """The file was replaced or changed while it was read, again on every retry: a writer
    keeps replacing it. Loading again later gives one whole version."""

    kind = "changed"


_BY_KIND: dict[str, type[FastensorError]] = {
    cls.kind: cls
    for cls in (
        NotFoundError,
        PermissionDeniedError,
        AlreadyExistsError,
        UnavailableError,
        UnsupportedError,
        InvalidInputError,
        CorruptError,
        StorageFullError,
        OutOfMemoryError,
        DeviceError,
        FastensorIOError,
        FileChangedError,
    )
}


def _from_native(
    kind: str,
    message: str,
    path: str | None,
    offset: int | None,
    backend: str | None,
    os_errno: int | None,
) -> FastensorError:
    """Builds the exception for an error raised by the native module."""
    # A kind this module does not know yet is still an OSError callers can catch.
    cls = _BY_KIND.get(kind, FastensorIOError)
    exc = cls(message)
    exc.path = path
    exc.offset = offset
    exc.backend = backend
    if isinstance(exc, OSError):
        if os_errno is None and kind == "storage_full":
            os_errno = _errno.ENOSPC
        exc.errno = os_errno
        exc.strerror = message
        exc.filename = path
    return exc


def _invalid(message: str, path: object = None) -> InvalidInputError:
    """An :class:`InvalidInputError` raised by the Python side."""
    exc = InvalidInputError(message)
    exc.path = None if path is None else str(path)
    return exc
