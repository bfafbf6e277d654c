"""The exceptions fastensor raises.

Every error is a :class:`FastensorError` and also the builtin exception callers already
catch: a missing file is a :class:`FileNotFoundError`, a corrupt file or a bad argument a
:class:`ValueError`, a full disk an :class:`OSError`, and so on. Each carries the ``path``,
``offset`` and ``backend`` the error happened at, where known.

Code written for ``safetensors`` catches ``safetensors.SafetensorError``: here that name is
:class:`SafetensorError`, the base of the errors safetensors reports under it (a corrupt
file, a bad argument or slice, a closed file), exported as ``fastensor.SafetensorError``.
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Callable
from typing import TypeVar

__all__ = [
    "FastensorError",
    "SafetensorError",
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
    "GroupError",
    "WrongTypeError",
    "SliceIndexError",
    "SharedTensorsError",
    "NoDataError",
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


_BY_KIND: dict[str, type[FastensorError]] = {}
"""The class :func:`_from_native` raises for each native error kind (filled by :func:`_kind`)."""

_E = TypeVar("_E", bound=type[FastensorError])


def _kind(kind: str) -> Callable[[_E], _E]:
    """Class decorator: the class's ``kind`` is ``kind``, and native errors of that kind
    are raised as that class (one class a kind)."""

    def register(cls: _E) -> _E:
        assert kind not in _BY_KIND, f"two error classes of kind {kind!r}"
        cls.kind = kind
        _BY_KIND[kind] = cls
        return cls

    return register


class SafetensorError(FastensorError):
    """What ``safetensors`` raises as ``SafetensorError``: the base of
    :class:`CorruptError` and :class:`InvalidInputError` (a bad argument, a slice out of
    range, a read from a closed file). Catching it catches what code written for
    ``safetensors.SafetensorError`` expects to catch. A missing file stays a
    :class:`FileNotFoundError` (:class:`NotFoundError`), as in safetensors."""


@_kind("not_found")
class NotFoundError(FastensorError, FileNotFoundError):
    """A file, tensor or backend that was asked for does not exist."""


@_kind("permission_denied")
class PermissionDeniedError(FastensorError, PermissionError):
    """The operating system refused access."""


@_kind("already_exists")
class AlreadyExistsError(FastensorError, FileExistsError):
    """Something that must be new already exists."""


@_kind("unavailable")
class UnavailableError(FastensorError, RuntimeError):
    """A backend cannot run on this machine (missing library or kernel feature)."""


@_kind("unsupported")
class UnsupportedError(FastensorError, RuntimeError):
    """The operation is not supported here (e.g. GPU memory without a CUDA backend)."""


@_kind("invalid_input")
class InvalidInputError(SafetensorError, ValueError):
    """An argument is wrong: a dtype, a shape, a name, a path that is not a file."""


class WrongTypeError(InvalidInputError, TypeError):
    """An argument of the wrong type (a value that is not a tensor, tensors not in a dict):
    a :class:`TypeError`, and the :class:`ValueError` ``safetensors`` raises there."""


class SliceIndexError(InvalidInputError, IndexError):
    """An index of a slice out of a dimension's range (or with too many dimensions): a
    :class:`SafetensorError`, and the :class:`IndexError` torch and numpy raise there."""


class SharedTensorsError(InvalidInputError, RuntimeError):
    """Tensors given to a save share memory: saved apart, they would be duplicated on disk
    and no longer shared when loaded. A :class:`RuntimeError`, as in ``safetensors``."""


class NoDataError(InvalidInputError, RuntimeError):
    """A tensor given to a save has no data (a meta tensor): a :class:`ValueError`, and
    the :class:`RuntimeError` ``safetensors`` raises there."""


@_kind("corrupt")
class CorruptError(SafetensorError, ValueError):
    """A file's content is not what the safetensors format promises (or it is truncated)."""


@_kind("storage_full")
class StorageFullError(FastensorError, OSError):
    """The file system is full or a quota is exhausted."""


@_kind("out_of_memory")
class OutOfMemoryError(FastensorError, MemoryError):
    """Memory could not be allocated."""


@_kind("device")
class DeviceError(FastensorError, RuntimeError):
    """A GPU or driver call failed."""


@_kind("io")
class FastensorIOError(FastensorError, OSError):
    """Any other operating-system I/O error."""


@_kind("changed")
class FileChangedError(FastensorError, OSError):
    """The file was replaced or changed while it was read, again on every retry: a writer
    keeps replacing it. Loading again later gives one whole version."""


class GroupError(FastensorError, RuntimeError):
    """A load by a process group failed in the group itself: a rank died, or a collective
    failed or timed out (raised on every rank that saw it, naming the file)."""

    kind = "group"


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
    if kind == "not_found" and os_errno == _errno.ENOENT and path is not None:
        message = f"No such file or directory: {path}"  # (as Python and safetensors say it)
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


def _invalid(
    message: str, path: object = None, cls: type[InvalidInputError] = InvalidInputError
) -> InvalidInputError:
    """An :class:`InvalidInputError` (or ``cls``) raised by the Python side."""
    exc = cls(message)
    exc.path = None if path is None else str(path)
    return exc
