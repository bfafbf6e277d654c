"""The engine behind the module-level functions, and the choice of an engine per call."""

from __future__ import annotations

import atexit
import os
import threading
import warnings

from . import _native

__all__ = ["Engine", "default_engine", "backends", "Backend"]


class Engine:
    """A fastensor engine: the I/O backends it may use, the selector that picks one per
    transfer, and the profile where what it learns is kept.

    Pass one as ``engine=`` to any load or save function; without one, they use
    :func:`default_engine`. An engine is configuration and learned state only: every read
    and write goes through the functions of :mod:`fastensor.torch`, :mod:`fastensor.numpy`
    and :mod:`fastensor.dcp`, which lend it the tensors' memory.

    Args:
        backends: the names of the backends it may use (default: every available one; see
            :func:`backends`).
        profile: where the selection profile is loaded from and saved to (default: none,
            nothing is remembered).
        pin: one backend for every transfer.
        mapped_loads: whether a load into new host memory (``load_file`` and
            ``load_selected`` to the CPU) may map the file copy-on-write, its pages brought
            in by several threads, instead of reading it into new memory through a
            backend (default: yes, unless a backend is pinned or none of ``backends``
            reads through the page cache). A mapped load holds a read lease on the file:
            another program that opens the file for writing or truncates it waits until
            the loaded tensors' pages are moved into memory of this process, so they keep
            their bytes. See :func:`fastensor.torch.load_file`.
        unprotected_maps: where a mapped load cannot have a read lease (another process
            has the file open for writing, a file system that grants none, another user's
            file without ``CAP_LEASE``), map the file anyway, unprotected: a rewrite in
            place then shows through the tensors and a truncation makes a read of them
            raise ``SIGBUS``, as with every mmap-based loader (default: no; such a load
            reads the file into memory of its own).
        cache_dir: a directory on a local SSD where remote checkpoints (``s3://``, ``gs://``,
            ``az://``) are kept once loaded: each load asks the server for the object's
            current version (one HEAD) and loads the local copy of that version, fetching it
            first where it is missing (published whole, atomically; processes loading the
            same object fetch it once). A replaced object is fetched again, never served
            stale. Default: ``$FASTENSOR_CACHE_DIR``, else no cache.
        cache_max_bytes: the most bytes the cache keeps (least recently used copies go
            first); default a quarter of its file system (``$FASTENSOR_CACHE_MAX_BYTES``
            sizes the cache ``$FASTENSOR_CACHE_DIR`` names).

    Raises:
        NotFoundError: an unknown backend name (the message lists the known ones).
        UnavailableError: a pinned backend that cannot run here.
    """

    __slots__ = ("_native", "__weakref__")

    def __init__(
        self,
        backends: list[str] | None = None,
        profile: str | os.PathLike[str] | None = None,
        pin: str | None = None,
        mapped_loads: bool = True,
        unprotected_maps: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_max_bytes: int | None = None,
    ) -> None:
        if profile is not None:
            profile = os.fspath(profile)
        self._native = _native.Engine(
            backends=backends,
            profile=profile,
            pin=pin,
            mapped_loads=mapped_loads,
            unprotected_maps=unprotected_maps,
            cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
            cache_max_bytes=cache_max_bytes,
        )

    def new_loads(self) -> tuple[int, int]:
        """Loads into new host memory decided so far: ``(mapped, read)``, one per load."""
        return self._native.new_loads()

    def decisions(self) -> dict[str, int]:
        """What the engine decided so far: ``mapped_loads`` and ``read_loads`` (loads into
        new host memory, one decision each), ``read_jobs`` (loads into existing memory,
        each sent through one backend chosen once), and the selector's ``choices`` and
        ``explorations``."""
        return dict(self._native.decisions())

    def backend_names(self) -> list[str]:
        """The names of the backends this engine may use, sorted."""
        return self._native.backend_names()

    def pin(self, backend: str | None = None) -> None:
        """Uses ``backend`` for every transfer, or lets the selector choose with ``None``."""
        self._native.pin(backend)

    @property
    def pinned(self) -> str | None:
        """The pinned backend, if any."""
        return self._native.pinned

    @property
    def profile_warning(self) -> str | None:
        """Why the profile was not used (another machine or format version), if it was not."""
        return self._native.profile_warning

    def report(self) -> str:
        """What the engine chose and measured so far, as a table."""
        return self._native.report()

    def save_profile(self) -> None:
        """Saves what the engine learned to its profile (atomically)."""
        self._native.save_profile()

    @property
    def staging_bytes(self) -> int:
        """Bytes of host memory kept for the next asynchronous save's snapshot."""
        return self._native.staging_bytes

    def release_staging(self) -> None:
        """Frees the memory kept for the next asynchronous save's snapshot."""
        self._native.release_staging()

    def __repr__(self) -> str:
        return repr(self._native)


_lock = threading.Lock()
_default: Engine | None = None


def default_engine() -> Engine:
    """The engine the module-level functions use, built on first use.

    It may use every available backend and keeps what it learns in the profile the
    ``fastensor`` command uses (``$FASTENSOR_PROFILE``, else
    ``~/.cache/fastensor/profile.toml``; an empty ``FASTENSOR_PROFILE`` means none). The
    profile is saved when the interpreter exits.
    """
    global _default
    with _lock:
        if _default is None:
            profile = _native.default_profile_path()  # None: FASTENSOR_PROFILE=""
            _default = Engine(profile=profile)
            warning = _default.profile_warning
            if warning:
                warnings.warn(f"fastensor: profile not used: {warning}", stacklevel=3)
            if profile is not None:
                atexit.register(_save_default_profile)
        return _default


def _save_default_profile() -> None:
    engine = _default
    if engine is None:
        return
    try:
        profile = _native.default_profile_path()
        if profile is not None:
            os.makedirs(os.path.dirname(os.fspath(profile)) or ".", exist_ok=True)
        engine.save_profile()
    except Exception as exc:  # exiting: report, never raise
        warnings.warn(f"fastensor: the profile was not saved: {exc}", stacklevel=1)


_exit_hook = False


def watch_pending_saves() -> None:
    """Makes the interpreter's exit wait for background saves nobody waited for (with a
    warning naming them): an exit never drops a save silently. ``os._exit`` and a killed
    process skip this, as they skip every exit handler: ``wait()`` on each handle."""
    global _exit_hook
    with _lock:
        if not _exit_hook:
            atexit.register(_finish_pending_saves)
            _exit_hook = True


def _finish_pending_saves() -> None:
    pending = _native.pending_saves()
    if pending:
        names = ", ".join(os.fspath(p) for p in pending[:5])
        more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
        warnings.warn(
            f"fastensor: the interpreter is exiting with {len(pending)} background save(s)"
            f" not waited for ({names}{more}); waiting for them to finish",
            RuntimeWarning,
            stacklevel=1,
        )
        _native.wait_pending_saves()


def engine_or_default(engine: Engine | None) -> _native.Engine:
    """The native engine of ``engine``, or of the default engine when ``None``."""
    if engine is None:
        engine = default_engine()
    elif not isinstance(engine, Engine):
        raise TypeError(f"engine must be a fastensor.Engine, not {type(engine).__name__}")
    return engine._native


class Backend(tuple):
    """One backend compiled into this build: ``(name, available, detail, capabilities)``."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return self[0]

    @property
    def available(self) -> bool:
        return self[1]

    @property
    def detail(self) -> str | None:
        """How it runs when available, or why it is not."""
        return self[2]

    @property
    def capabilities(self) -> str:
        return self[3]

    def __repr__(self) -> str:
        state = "available" if self.available else "unavailable"
        extra = f": {self.detail}" if self.detail else ""
        return f"<Backend {self.name} ({state}{extra})>"


def backends() -> list[Backend]:
    """Every backend compiled into this build, available or not (and why)."""
    return [Backend(b) for b in _native.backends()]
