"""The engine behind the module-level functions, and the choice of an engine per call."""

from __future__ import annotations

import atexit
import os
import threading
import warnings

from . import _native

__all__ = ["Engine", "default_engine", "backends", "Backend"]

Engine = _native.Engine

_lock = threading.Lock()
_default: _native.Engine | None = None


def default_engine() -> _native.Engine:
    """The engine the module-level functions use, built on first use.

    It may use every available backend and keeps what it learns in the profile the
    ``fastensor`` command uses (``$FASTENSOR_PROFILE``, else
    ``~/.cache/fastensor/profile.toml``; an empty ``FASTENSOR_PROFILE`` means none). The
    profile is saved when the interpreter exits.
    """
    global _default
    with _lock:
        if _default is None:
            profile = None
            if os.environ.get("FASTENSOR_PROFILE", None) != "":
                profile = _native.default_profile_path()
            _default = _native.Engine(profile=None if profile is None else os.fspath(profile))
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


def engine_or_default(engine: _native.Engine | None) -> _native.Engine:
    """``engine``, or the default engine when ``None``."""
    return default_engine() if engine is None else engine


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
