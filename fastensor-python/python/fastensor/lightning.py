"""Lightning checkpoints saved and loaded through fastensor's engine.

:class:`CheckpointIO` is a ``lightning.pytorch.plugins.io.CheckpointIO``: hand it to the
``Trainer`` and every checkpoint Lightning writes (``ModelCheckpoint``,
``trainer.save_checkpoint``) and reads back (``trainer.fit(ckpt_path=...)``, ``test``,
``validate``, ``predict``) moves through the engine::

    import lightning as L
    from fastensor.lightning import CheckpointIO

    trainer = L.Trainer(plugins=[CheckpointIO()])

:class:`AsyncCheckpointIO` saves in the background (``save_checkpoint`` returns once the
tensors are copied to reused staging memory): ``L.Trainer(plugins=[AsyncCheckpointIO()])``.
:class:`CheckpointIO` also works inside Lightning's own ``AsyncCheckpointIO``.

Layout: one checkpoint is one safetensors file (the path Lightning asks for, ``.ckpt`` as
usual), saved durably and atomically (temporary file, sync, rename): after a crash the path
holds the previous checkpoint or the new one, whole. Its tensors are the checkpoint's dense
tensors (model weights, optimizer state, ...) named by where they sit in the checkpoint, e.g.
``state_dict/layer.weight`` or ``optimizer_states/0/state/0/exp_avg``. The rest of the
checkpoint (the nested dicts and lists, loop and callback state, hyper-parameters; ``None``
where the tensors were, and where each one goes) is kept as ``torch.save`` bytes in the
``U8`` tensor :data:`SKELETON`, so it comes back as ``torch.load`` would give it (and loads
with ``weights_only=True`` where Lightning's own file does). Tensors that safetensors cannot
hold (another layout or dtype, subclasses) stay in that skeleton.

Sharing is kept as ``torch.save`` keeps it: a tensor that appears several times is saved
once and comes back as one tensor, and tensors that share memory (tied weights, views) are
saved once (the tensor that covers the memory, else the memory's bytes) and come back as
views of it. A tensor that shares nothing comes back contiguous.

``LightningModule.load_from_checkpoint`` reads with ``torch.load`` and does not take a
``CheckpointIO``; load such a file with :func:`load_checkpoint` and the module's
``load_state_dict(ckpt["state_dict"])``. Checkpoints written by Lightning's default
``TorchCheckpointIO`` still load through :class:`CheckpointIO` (they are read with Lightning's
own loader), so switching needs no conversion.
"""

from __future__ import annotations

import io
import os
import shutil
from collections import OrderedDict
from typing import Any

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _LightningCheckpointIO

from . import torch as _fst
from ._common import PathLike, fspath
from ._engine import Engine
from ._native import SaveHandle

__all__ = [
    "SKELETON",
    "AsyncCheckpointIO",
    "CheckpointIO",
    "load_checkpoint",
    "save_checkpoint",
    "save_checkpoint_async",
]

#: The name of the tensor holding the ``torch.save`` bytes of the checkpoint's skeleton.
SKELETON = "__fastensor_lightning_skeleton__"

#: The metadata key (and format version) that marks a file written by :func:`save_checkpoint`.
_FORMAT_KEY = "fastensor.lightning"
_FORMAT_VERSION = "1"

_SAFETENSORS_HEADER_START = 8  # the 8-byte header length; the JSON header follows

#: The containers walked for tensors; anything else is kept whole in the skeleton.
_WALKED = (dict, OrderedDict, list, tuple)


def _saved_dtypes() -> frozenset[torch.dtype]:
    """The torch dtypes :func:`fastensor.torch.save_file` saves."""
    try:
        from ._torch_dtypes import TO_NAME
    except ImportError:
        TO_NAME = _fst._TO_NAME  # noqa: N806
    return frozenset(TO_NAME)


_SAVED_DTYPES = _saved_dtypes()


def _storable(t: torch.Tensor) -> bool:
    """True for a tensor the safetensors file can hold as it is."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and not t.is_nested
        and t.device.type in ("cpu", "cuda")
        and t.dtype in _SAVED_DTYPES
    )


def _storage_key(t: torch.Tensor) -> tuple | None:
    """What identifies ``t``'s memory (``None`` for a tensor with none)."""
    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return (t.device, storage.data_ptr())


def _covers_storage(t: torch.Tensor) -> bool:
    """True when ``t`` is its whole storage, contiguous from its start."""
    return (
        t.storage_offset() == 0
        and t.is_contiguous()
        and t.numel() * t.element_size() == t.untyped_storage().nbytes()
    )


class _Splitter:
    """Takes a checkpoint apart: its storable tensors by name, a skeleton with ``None`` in
    their places, and :attr:`refs`, one ``[name, device, requires_grad, is_param, view,
    paths]`` per tensor: ``paths`` lists where it goes (the keys and indices from the root),
    ``view`` is ``None`` or ``(base, dtype, shape, stride, offset)`` for a tensor that
    shares memory (see :meth:`share`). Plain data only: the skeleton unpickles with
    ``weights_only=True`` and no allow-listed class."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.refs: list[list] = []
        self._by_id: dict[int, list] = {}
        self._copies: dict[int, Any] = {}

    def _unique(self, base: str) -> str:
        name, n = base, 1
        while name in self.tensors or name == SKELETON:
            n += 1
            name = f"{base}#{n}"
        return name

    def split(self, obj: Any, path: tuple) -> Any:
        """The skeleton of ``obj``, found at ``path`` in the checkpoint."""
        if isinstance(obj, torch.Tensor) and _storable(obj):
            ref = self._by_id.get(id(obj))
            if ref is None:
                name = self._unique("/".join(map(str, path)) or "tensor")
                self.tensors[name] = obj  # (kept alive here: its id stays unique)
                is_param = isinstance(obj, torch.nn.Parameter)
                ref = [name, str(obj.device), obj.requires_grad, is_param, None, []]
                self._by_id[id(obj)] = ref
                self.refs.append(ref)
            ref[5].append(path)
            return None
        kind = type(obj)
        if kind not in _WALKED:
            return obj
        if kind is tuple:  # (not shared: a tuple is rebuilt where it is)
            return tuple(self.split(v, (*path, i)) for i, v in enumerate(obj))
        done = self._copies.get(id(obj))
        if done is not None:  # the same container again: one copy, filled once
            return done
        if kind is list:
            out: Any = []
            self._copies[id(obj)] = out
            out.extend(self.split(v, (*path, i)) for i, v in enumerate(obj))
            return out
        out = kind()
        self._copies[id(obj)] = out
        for k, v in obj.items():
            out[k] = self.split(v, (*path, k))
        if kind is OrderedDict and vars(obj):
            vars(out).update(vars(obj))  # a state dict's `_metadata` (module versions)
        return out

    def share(self) -> None:
        """Turns each group of tensors sharing memory into one saved tensor (the one that
        covers the memory whole, else the memory's bytes as ``U8``) and views of it."""
        groups: dict[tuple, list[str]] = {}
        for name, t in self.tensors.items():
            key = _storage_key(t)
            if key is not None:
                groups.setdefault(key, []).append(name)
        refs = {ref[0]: ref for ref in self.refs}
        for names in groups.values():
            if len(names) < 2:
                continue
            members = {n: self.tensors.pop(n) for n in names}
            whole = [n for n in names if _covers_storage(members[n])]
            if whole:
                base = whole[0]
                self.tensors[base] = members[base]
            else:
                first = members[names[0]]
                base = self._unique(names[0] + "#storage")
                raw = torch.empty(0, dtype=torch.uint8, device=first.device)
                self.tensors[base] = raw.set_(first.untyped_storage())
            for n in names:
                if n != base:
                    t = members[n]
                    shape, stride = list(t.shape), list(t.stride())
                    refs[n][4] = (base, t.dtype, shape, stride, t.storage_offset())


def _put(container: Any, path: tuple, value: Any) -> Any:
    """``container`` with ``value`` at ``path`` (lists and dicts changed in place, tuples
    rebuilt); returns the container (a new one for a tuple)."""
    key, rest = path[0], path[1:]
    child = value if not rest else _put(container[key], rest, value)
    if type(container) is tuple:
        return (*container[:key], child, *container[key + 1 :])
    container[key] = child
    return container


def save_checkpoint(
    checkpoint: dict[str, Any], path: PathLike, *, engine: Engine | None = None
) -> None:
    """Saves the Lightning checkpoint ``checkpoint`` (any nested dict of tensors and Python
    objects) to ``path`` as one safetensors file, durably and atomically (see the module's
    documentation for the layout). Missing parent directories are created.

    Raises:
        TypeError, ValueError: as :func:`fastensor.torch.save_file`; and for anything
            ``torch.save`` cannot pickle.
        OSError: the file could not be written; the previous file at ``path`` is kept.
    """
    p, tensors = _split(checkpoint, path)
    _fst.save_file(tensors, p, {_FORMAT_KEY: _FORMAT_VERSION}, engine=engine)


def save_checkpoint_async(
    checkpoint: dict[str, Any], path: PathLike, *, engine: Engine | None = None
) -> SaveHandle:
    """:func:`save_checkpoint` in the background: returns once the checkpoint's tensors are
    copied to the engine's staging memory (CUDA tensors through the host), so training may
    change them at once; the file is then written as :func:`save_checkpoint` writes it.
    The handle's ``wait()`` blocks until it is and raises its error, if any; ``done()``
    polls. Saves to one path land in the order they were made.

    Raises:
        TypeError, ValueError: as :func:`save_checkpoint`, before anything is started.
    """
    p, tensors = _split(checkpoint, path)
    return _fst.save_file_async(tensors, p, {_FORMAT_KEY: _FORMAT_VERSION}, engine=engine)


def _split(checkpoint: dict[str, Any], path: PathLike) -> tuple[str, dict[str, torch.Tensor]]:
    """The path as a string (its parent directories made) and the tensors of the file that
    holds ``checkpoint``: its dense tensors and the skeleton."""
    p = fspath(path)
    splitter = _Splitter()
    skeleton = splitter.split(checkpoint, ())
    splitter.share()
    buf = io.BytesIO()
    torch.save({"skeleton": skeleton, "tensors": splitter.refs}, buf)
    tensors = dict(splitter.tensors)
    tensors[SKELETON] = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)
    parent = os.path.dirname(p)
    if parent:
        os.makedirs(parent, exist_ok=True)
    return p, tensors


def _is_safetensors(path: str) -> bool:
    """True when ``path`` starts as a safetensors file does (a length, then a JSON header)."""
    with open(path, "rb") as f:
        head = f.read(_SAFETENSORS_HEADER_START + 1)
    return len(head) > _SAFETENSORS_HEADER_START and head[_SAFETENSORS_HEADER_START:] == b"{"


def _one_device(map_location: Any) -> torch.device | None:
    """The device every tensor goes to under ``map_location``, where it names one (``None``
    for a dict or a callable, which map each saved device)."""
    if map_location is None:
        return torch.device("cpu")
    if isinstance(map_location, int):
        return torch.device("cuda", map_location)
    if isinstance(map_location, str | torch.device):
        return torch.device(map_location)
    if isinstance(map_location, dict) or callable(map_location):
        return None
    raise TypeError(
        "map_location must be None, a device, a str, an int, a dict or a callable,"
        f" not {type(map_location).__name__}"
    )


def _placed(t: torch.Tensor, saved_device: str, map_location: Any) -> torch.Tensor:
    """``t`` (on the CPU) where the dict or callable ``map_location`` puts a tensor saved on
    ``saved_device``, as ``torch.load`` applies it (a callable returning ``None`` means the
    saved device)."""
    if isinstance(map_location, dict):
        device = torch.device(map_location.get(saved_device, saved_device))
    else:
        storage = map_location(t.untyped_storage(), saved_device)
        device = torch.device(saved_device) if storage is None else storage.device
    return t if device == t.device else t.to(device)


def _view(base: torch.Tensor, view: tuple) -> torch.Tensor:
    """The view ``(base name, dtype, shape, stride, offset)`` of the loaded ``base`` (whose
    start the caller has aligned to ``dtype``)."""
    _, dtype, shape, stride, offset = view
    start = base.storage_offset() * base.element_size() // dtype.itemsize
    out = torch.empty(0, dtype=dtype, device=base.device)
    return out.set_(base.untyped_storage(), start + offset, shape, stride)


def _skeleton_of(stored: dict[str, torch.Tensor], path: str, location: Any, weights_only):
    """The skeleton and tensor records, unpickled from the file's :data:`SKELETON`."""
    raw = stored.pop(SKELETON, None)
    if raw is None or raw.dtype != torch.uint8 or raw.dim() != 1:
        raise ValueError(f"{path}: the checkpoint's skeleton tensor {SKELETON} is missing")
    data = bytearray(raw.numel())
    if data:
        torch.frombuffer(data, dtype=torch.uint8).copy_(raw)
    saved = torch.load(io.BytesIO(data), map_location=location, weights_only=weights_only)
    if not isinstance(saved, dict) or not {"skeleton", "tensors"} <= saved.keys():
        raise ValueError(f"{path}: the checkpoint's skeleton is not one fastensor wrote")
    return saved["skeleton"], saved["tensors"]


def load_checkpoint(
    path: PathLike,
    map_location: Any = None,
    weights_only: bool | None = None,
    *,
    engine: Engine | None = None,
) -> dict[str, Any]:
    """Loads a checkpoint saved by :func:`save_checkpoint` (or :class:`CheckpointIO`).

    ``map_location`` places the tensors as ``torch.load``'s does (a device, a str, a dict
    from saved device to device, or a callable ``(storage, location)``), except that
    ``None``, the default, loads them onto the CPU, as Lightning's ``TorchCheckpointIO``
    does by default. A CPU or CUDA device gets every tensor read straight into it; a dict
    or a callable loads onto the CPU, then moves them. ``weights_only`` is passed to
    ``torch.load`` for the skeleton (``None``: torch's default).

    A checkpoint in ``torch.save``'s format (Lightning's default) is loaded with Lightning's
    own loader instead.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: a safetensors file that is not such a checkpoint, or a corrupt one.
    """
    p = fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"Checkpoint file not found: {p}")
    if os.path.isfile(p) and not _is_safetensors(p):
        from lightning.fabric.utilities.cloud_io import _load as lightning_load

        location = map_location if map_location is not None else (lambda storage, loc: storage)
        return lightning_load(p, map_location=location, weights_only=weights_only)
    with _fst.safe_open(p, engine=engine) as f:
        meta = f.metadata() or {}
    if meta.get(_FORMAT_KEY) != _FORMAT_VERSION:
        raise ValueError(
            f"{p}: not a Lightning checkpoint saved by fastensor.lightning"
            f" (its metadata has no {_FORMAT_KEY}={_FORMAT_VERSION})"
        )
    device = _one_device(map_location)
    direct = device is not None and device.type in ("cpu", "cuda")  # the engine's devices
    stored = _fst.load_file(p, device=device if direct else "cpu", engine=engine)
    location = device if device is not None else map_location
    skeleton, records = _skeleton_of(stored, p, location, weights_only)
    if device is not None and not direct:  # e.g. meta: read to the host, then moved
        stored = {n: t.to(device) for n, t in stored.items()}
    bases = {(r[0] if r[4] is None else r[4][0]): r for r in records}
    missing = sorted(bases.keys() - stored.keys())
    if missing:
        raise ValueError(f"{p}: the checkpoint lacks the tensor(s) {missing[:5]}")
    if device is None:  # a dict or a callable: each stored tensor after its saved device
        stored = {n: _placed(stored[n], r[1], map_location) for n, r in bases.items()}
    for _, _, _, _, view, _ in records:  # a view's base must start where its dtype can
        if view is not None:
            base = stored[view[0]]
            if base.storage_offset() * base.element_size() % view[1].itemsize:
                stored[view[0]] = base.clone()
    for name, _, requires_grad, is_param, view, paths in records:
        t = stored[name] if view is None else _view(stored[view[0]], view)
        if is_param:
            t = torch.nn.Parameter(t, requires_grad=requires_grad)
        elif requires_grad:
            t = t.requires_grad_(True)
        for where in paths:
            if not where:
                return t  # (the checkpoint itself was a tensor)
            skeleton = _put(skeleton, where, t)
    return skeleton


class CheckpointIO(_LightningCheckpointIO):
    """A Lightning ``CheckpointIO`` that saves and loads checkpoints through fastensor (see
    the module's documentation for the layout and its guarantees).

    Args:
        engine: the fastensor engine to use (default: the shared default engine).
    """

    def __init__(self, *, engine: Engine | None = None) -> None:
        super().__init__()
        self.engine = engine

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: PathLike, storage_options: Any | None = None
    ) -> None:
        """Saves ``checkpoint`` to ``path``: one safetensors file, durable and atomic.

        Raises:
            TypeError: ``storage_options`` were given (this plugin takes none, as Lightning's
                ``TorchCheckpointIO``).
        """
        self._refuse(storage_options)
        save_checkpoint(checkpoint, path, engine=self.engine)

    def _refuse(self, storage_options: Any | None) -> None:
        """Refuses ``storage_options``, as Lightning's ``TorchCheckpointIO`` does."""
        if storage_options is not None:
            raise TypeError(
                "`Trainer.save_checkpoint(..., storage_options=...)` with `storage_options` arg"
                f" is not supported for `{type(self).__name__}`."
            )

    def load_checkpoint(
        self, path: PathLike, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Loads the checkpoint at ``path`` (see :func:`load_checkpoint`)."""
        return load_checkpoint(path, map_location, weights_only, engine=self.engine)

    def remove_checkpoint(self, path: PathLike) -> None:
        """Removes the checkpoint at ``path``; nothing when there is none."""
        p = fspath(path)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.unlink(p)


class AsyncCheckpointIO(CheckpointIO):
    """A :class:`CheckpointIO` whose saves run in the background: ``save_checkpoint``
    returns once the checkpoint's tensors are copied to the engine's staging memory
    (:func:`save_checkpoint_async`), reused from one checkpoint to the next, and training
    goes on while the file is written. Use it in place of wrapping :class:`CheckpointIO` in
    Lightning's ``AsyncCheckpointIO``, which clones every tensor into new memory on each save::

        L.Trainer(plugins=[fastensor.lightning.AsyncCheckpointIO()])

    One save is in flight at a time: a save first waits for the one before it to be
    written, so memory holds one snapshot and the next save reuses its staging. A save's
    error is raised by the next save (which then starts nothing), by a load or removal of its
    path (which first waits for it), or by ``teardown()`` (which Lightning calls when
    ``fit``, ``validate``, ... end, and which waits for it). :meth:`wait` waits too. An
    interpreter that exits with a save still running waits for it (with a warning).

    The snapshot is a copy of every tensor: where memory is slow to fault in and the disk
    fast, the first snapshot of a process can take longer than :class:`CheckpointIO`'s
    whole save (see the Lightning rows of ``bench/integrations.py``); the background save
    pays where writing is slower than copying.

    Args:
        engine: the fastensor engine to use (default: the shared default engine).
    """

    def __init__(self, *, engine: Engine | None = None) -> None:
        super().__init__(engine=engine)
        # The save in flight: its absolute path and handle.
        self._running: tuple[str, SaveHandle] | None = None

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: PathLike, storage_options: Any | None = None
    ) -> None:
        """Waits for the save before it, then starts saving ``checkpoint`` to ``path``
        (one safetensors file, durable and atomic once written) and returns once its
        tensors are copied.

        Raises:
            TypeError: ``storage_options`` were given.
            Exception: the error of the save before it, if that one failed.
        """
        self._refuse(storage_options)
        self.wait()
        p = fspath(path)
        self._running = (
            os.path.abspath(p),
            save_checkpoint_async(checkpoint, p, engine=self.engine),
        )

    def load_checkpoint(
        self, path: PathLike, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Loads the checkpoint at ``path`` once a save of it in flight is written (see
        :func:`load_checkpoint`)."""
        self._wait_for(path)
        return super().load_checkpoint(path, map_location, weights_only)

    def remove_checkpoint(self, path: PathLike) -> None:
        """Removes the checkpoint at ``path`` once a save of it in flight is written."""
        self._wait_for(path)
        super().remove_checkpoint(path)

    def wait(self) -> None:
        """Blocks until the save in flight, if any, is written; raises its error."""
        running, self._running = self._running, None
        if running is not None:
            running[1].wait()

    def teardown(self) -> None:
        """Waits for the save in flight (Lightning calls this at the end of each run);
        raises its error."""
        self.wait()

    def _wait_for(self, path: PathLike) -> None:
        if self._running is not None and self._running[0] == os.path.abspath(fspath(path)):
            self.wait()
