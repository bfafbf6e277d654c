"""Hugging Face ``transformers`` models loaded and saved through fastensor's engine.

:func:`from_pretrained` gives the model ``model_class.from_pretrained(path)`` gives (the same
tensors, tied weights, dtype, buffers, generation config, ``eval()`` mode), with the weights
read by the engine from the directory's ``model.safetensors`` or sharded checkpoint
(``model.safetensors.index.json``), each file's reads in flight together::

    from transformers import AutoModelForCausalLM
    import fastensor.transformers as ft

    model = ft.from_pretrained(AutoModelForCausalLM, "out/gpt2", dtype="auto")
    ft.save_pretrained(model, "out/gpt2-copy", max_shard_size="2GB")

The model is built by transformers itself, on the meta device without initialising any
weight (as its ``from_pretrained`` builds it), while the engine maps the weights' files
and brings their pages into memory on threads of its own; the model adopts the mapped
tensors without copying them as soon as they exist (a cast to another ``dtype`` copies,
as in transformers), and the call returns once every page is in memory. The keyword
arguments are ``from_pretrained``'s. ``device_map`` naming one device (``"cuda:0"``) loads
straight onto it; any other map loads onto the CPU and transformers places the weights.
``path`` is a local directory (a Hub repository is fetched first, e.g. with
``huggingface_hub.snapshot_download``).

:func:`save_pretrained` writes what ``model.save_pretrained`` writes (``config.json``, the
generation config, the weights without tied duplicates as ``model.safetensors`` or as
``model-0000K-of-0000N.safetensors`` shards and their index), the weights through the engine:
each file durably and atomically, shards written concurrently, the index last.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

import torch

from . import _native
from . import torch as _fst
from ._common import PathLike, fspath, has_directories
from ._engine import Engine, engine_or_default
from ._host_load import load_host_later
from ._sharded import load_host_later_by_shard, parse_size
from .errors import FileChangedError

__all__ = ["from_pretrained", "save_pretrained", "weights_file"]

_WEIGHTS = "model.safetensors"
_INDEX = "model.safetensors.index.json"
# (shards saved under an object prefix carry their save's tag: model-00001-of-00003-TAG...)
_SHARD = re.compile(r"model-\d{5}-of-\d{5}(?:-[0-9a-f]{16})?\.safetensors")


def _with_variant(name: str, variant: str | None) -> str:
    """``name`` with ``variant`` before its extension, as transformers names variants
    (``model.fp16.safetensors``, ``model.safetensors.index.fp16.json``)."""
    if not variant:
        return name
    head, ext = name.rsplit(".", 1)
    return f"{head}.{variant}.{ext}"


def weights_file(
    directory: PathLike, variant: str | None = None, engine: Engine | None = None
) -> str:
    """The weights ``from_pretrained`` reads in ``directory`` (a local directory, or an object
    prefix ``s3://bucket/model``, listed through ``engine``): ``model.safetensors`` where
    there is one (transformers' preference), else ``model.safetensors.index.json``.

    Raises:
        FileNotFoundError: neither is there (e.g. only ``pytorch_model.bin``).
    """
    d = fspath(directory)
    wanted = (_with_variant(_WEIGHTS, variant), _with_variant(_INDEX, variant))
    if not has_directories(d):
        names = set(_native.list_names(engine_or_default(engine), d))
        found = [n for n in wanted if n in names]
    else:
        found = [n for n in wanted if os.path.isfile(os.path.join(d, n))]
    if found:
        return os.path.join(d, found[0])
    raise FileNotFoundError(
        f"{d}: no {_with_variant(_WEIGHTS, variant)} or {_with_variant(_INDEX, variant)}"
        " (fastensor reads safetensors checkpoints)"
    )


def _single_device(device_map: Any) -> torch.device | None:
    """The one device ``device_map`` names (a device, its name or ordinal, or a map whose
    entries all name it); ``None`` for a map that spreads the model or is computed."""
    if device_map is None:
        return torch.device("cpu")
    if isinstance(device_map, Mapping):
        devices = {str(v) for v in device_map.values()}
        if len(devices) != 1:
            return None
        device_map = next(iter(device_map.values()))
    if isinstance(device_map, int) and not isinstance(device_map, bool):
        return torch.device("cuda", device_map)
    if isinstance(device_map, torch.device):
        return device_map
    if isinstance(device_map, str):
        if device_map in ("auto", "balanced", "balanced_low_0", "sequential", "disk"):
            return None
        try:
            return torch.device(device_map)
        except RuntimeError:
            return None
    return None


def _load_weights(path: str, device: torch.device, engine: Engine | None) -> tuple[dict, list]:
    """The weights at ``path`` on ``device``, and the ``PendingPages`` still coming in (onto
    the CPU the files are mapped and the tensors returned at once, their pages brought in
    by threads of the engine's meanwhile)."""
    if device.type != "cpu":
        if path.endswith(".json"):
            return _fst.load_sharded(path, device=device, engine=engine), []
        return _fst.load_file(path, device=device, engine=engine), []
    native = engine_or_default(engine)
    if path.endswith(".json"):
        return load_host_later_by_shard(native, path)
    weights, pages = load_host_later(native, path)
    return weights, [] if pages is None else [pages]


def _load_group_weights(
    path: str, device: torch.device, engine: Engine | None, group: tuple
) -> tuple[dict, list]:
    """The weights at ``path`` on ``device``, loaded by every rank of a process group
    (``group``: ``(process_group, group_read)``; each byte read from storage once), and no
    pages still coming in."""
    pg, way = group
    load = _fst.load_sharded if path.endswith(".json") else _fst.load_file
    return load(path, device=device, engine=engine, process_group=pg, group_read=way), []


class _WeightsInFlight(dict):
    """The state dict handed to transformers while the engine is still loading it.

    The load runs on a thread of its own (the engine's calls release the GIL) while
    transformers reads the config and builds the model. It has two steps: the weights'
    files are mapped and their tensors made (every method of the dict waits for that, and
    raises its error, if any), their pages starting to come in at once; then those pages
    come in while transformers adopts the tensors (:meth:`finish` waits for them).
    :attr:`resolved` tells whether any method was called: code that reached the underlying
    storage without them saw it empty.
    """

    def __init__(self, load: Any) -> None:
        super().__init__()
        self.resolved = False
        self._error: BaseException | None = None
        self._made = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(load,), daemon=True)
        self._thread.start()

    def _run(self, load: Any) -> None:
        try:
            try:
                weights, pending = load()
                dict.update(self, weights)
            finally:
                self._made.set()
            for pages in pending:
                pages.wait()
        except BaseException as exc:  # raised again where the weights are next waited for
            self._error = exc

    def wait(self) -> None:
        """Waits for the tensors (their pages may still be coming in); raises the load's
        error."""
        self._made.wait()
        if self._error is not None:
            raise self._error

    def finish(self) -> None:
        """Waits for the whole load, every page in memory; raises its error."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def weights(self) -> dict:
        """The loaded weights as a plain ``dict`` (waits for the whole load)."""
        self.finish()
        return dict.copy(self)


def _waiting(name: str) -> Any:
    def method(self: _WeightsInFlight, *args: Any, **kwargs: Any) -> Any:
        self.wait()
        self.resolved = True
        return getattr(dict, name)(self, *args, **kwargs)

    method.__name__ = name
    return method


for _name in (
    "items", "keys", "values", "get", "copy", "pop", "popitem", "setdefault", "update",
    "__iter__", "__len__", "__contains__", "__getitem__", "__setitem__", "__delitem__",
    "__reversed__", "__or__", "__repr__", "__eq__", "__ne__",
):  # fmt: skip
    setattr(_WeightsInFlight, _name, _waiting(_name))
del _name


def from_pretrained(
    model_class: Any,
    pretrained_model_name_or_path: PathLike,
    *model_args: Any,
    engine: Engine | None = None,
    **kwargs: Any,
) -> Any:
    """``model_class.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)``
    with the weights read by fastensor's engine (see the module's documentation).

    ``model_class`` is a ``PreTrainedModel`` subclass or an auto class
    (``AutoModelForCausalLM``); ``pretrained_model_name_or_path`` a local directory written
    by ``save_pretrained`` (or :func:`save_pretrained`), or an object prefix holding one
    (``s3://bucket/model``: its JSON files are fetched, its weights read by ranged GETs
    straight into the tensors). ``subfolder`` and ``variant`` are
    honoured; ``state_dict`` cannot be given (the weights are the directory's).

    ``process_group=`` (a ``torch.distributed`` group; every rank calls this with the same
    path) loads the weights once for the group: each byte read from storage by one rank and
    broadcast, or every rank reading where that is as cheap (see
    :func:`fastensor.torch.load_file`; ``group_read=`` forces either way).

    Raises:
        FileNotFoundError: no such directory, or no safetensors weights in it.
        ValueError: ``state_dict`` was given.
    """
    path = fspath(pretrained_model_name_or_path)
    process_group = kwargs.pop("process_group", None)
    group_read = kwargs.pop("group_read", None)
    if process_group is not None:
        kwargs["_fastensor_group"] = (process_group, group_read)
    if "state_dict" in kwargs:
        raise ValueError("from_pretrained: the weights are read from the directory; no state_dict")
    if not has_directories(path):
        return _from_objects(model_class, path, model_args, engine, kwargs)
    directory = os.path.join(path, kwargs.get("subfolder") or "")
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"{directory}: not a directory (fastensor reads a local copy of the model;"
            " fetch a Hub repository first, e.g. with huggingface_hub.snapshot_download)"
        )
    weights = weights_file(directory, kwargs.pop("variant", None))
    return _from_pretrained(model_class, model_args, engine, kwargs, path, directory, weights)


def _from_objects(
    model_class: Any, url: str, model_args: tuple, engine: Engine | None, kwargs: dict[str, Any]
) -> Any:
    """:func:`from_pretrained` of an object prefix: its JSON files (the model's config, the
    generation config) are fetched into a temporary directory, where transformers reads
    them; the weights are read from their objects."""
    import tempfile

    native = engine_or_default(engine)
    subfolder = kwargs.get("subfolder") or ""
    prefix = os.path.join(url, subfolder)
    weights = weights_file(prefix, kwargs.pop("variant", None), engine)
    with tempfile.TemporaryDirectory(prefix="fastensor-config-") as local:
        config_dir = os.path.join(local, subfolder)
        os.makedirs(config_dir, exist_ok=True)
        for name in _native.list_names(native, prefix):
            if name.endswith(".json") and not name.endswith(".index.json"):
                data = _native.read_whole(native, os.path.join(prefix, name))
                with open(os.path.join(config_dir, name), "wb") as f:
                    f.write(data)
        out = _from_pretrained(model_class, model_args, engine, kwargs, local, config_dir, weights)
    model = out[0] if isinstance(out, tuple) else out
    model.config.name_or_path = url
    return out


def _from_pretrained(
    model_class: Any,
    model_args: tuple,
    engine: Engine | None,
    kwargs: dict[str, Any],
    path: str,
    directory: str,
    weights: str,
) -> Any:
    """``from_pretrained`` with the config at ``path`` (its ``subfolder`` ``directory``) and
    the weights at ``weights``."""
    if getattr(model_class, "_model_mapping", None) is not None:  # an auto class
        model_class = _concrete_class(model_class, path, kwargs)
    kwargs.pop("use_safetensors", None)
    device = _single_device(kwargs.get("device_map"))
    target = device or torch.device("cpu")
    if kwargs.get("config") is None:
        kwargs["config"] = path  # read (with subfolder and config kwargs) as from_pretrained does
    generation_config = kwargs.get("generation_config")
    # Each native load retries on its own; what starts over here is the model built around
    # tensors already handed out, when their file changed while their pages came in (the
    # native side cannot take those tensors back). As many tries as a native load makes.
    for attempt in range(_native.LOAD_ATTEMPTS):
        try:
            out = _build(model_class, model_args, kwargs, weights, target, engine)
            break
        except FileChangedError:
            if attempt + 1 == _native.LOAD_ATTEMPTS:
                raise
    model = out[0] if isinstance(out, tuple) else out
    model.config.name_or_path = path
    if generation_config is None and model.can_generate():
        model.generation_config = _generation_config(directory, model)
    return out


def _build(
    model_class: Any,
    model_args: tuple,
    kwargs: dict[str, Any],
    weights: str,
    device: torch.device,
    engine: Engine | None,
) -> Any:
    """``model_class.from_pretrained`` given the weights at ``weights`` as they load: it
    returns once every page of them is in memory."""
    group = kwargs.get("_fastensor_group")
    kwargs = {k: v for k, v in kwargs.items() if k != "_fastensor_group"}
    if group is None:
        state_dict = _WeightsInFlight(lambda: _load_weights(weights, device, engine))
    else:
        state_dict = _WeightsInFlight(lambda: _load_group_weights(weights, device, engine, group))
    try:
        out = model_class.from_pretrained(None, *model_args, state_dict=state_dict, **kwargs)
    finally:
        state_dict._thread.join()  # no load left running behind an error
    state_dict.finish()
    if not state_dict.resolved:  # (a transformers that read the dict's storage directly)
        plain = state_dict.weights()
        out = model_class.from_pretrained(None, *model_args, state_dict=plain, **kwargs)
    return out


def _concrete_class(auto_class: Any, path: str, kwargs: dict[str, Any]) -> Any:
    """The model class ``auto_class`` picks for the config at ``path`` (or ``kwargs``'
    ``config``), as its ``from_pretrained`` picks it."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.auto_factory import _get_model_class

    config = kwargs.get("config")
    if not isinstance(config, PretrainedConfig):
        config = AutoConfig.from_pretrained(
            fspath(config) if config is not None else path,
            subfolder=kwargs.get("subfolder") or "",
            trust_remote_code=kwargs.get("trust_remote_code"),
        )
    if type(config) not in auto_class._model_mapping:
        raise ValueError(
            f"{auto_class.__name__} has no model for {type(config).__name__} (for a model with"
            " its own code, pass its class)"
        )
    return _get_model_class(config, auto_class._model_mapping)


def _generation_config(directory: str, model: Any) -> Any:
    """The generation config ``from_pretrained`` gives a model of ``directory``: its
    ``generation_config.json``, else one made from its model config."""
    from transformers import GenerationConfig

    if os.path.isfile(os.path.join(directory, "generation_config.json")):
        return GenerationConfig.from_pretrained(directory)
    with contextlib.suppress(OSError, ValueError):
        return GenerationConfig.from_pretrained(
            directory, config_file_name="config.json", _from_model_config=True
        )
    return model.generation_config


def _state_to_save(model: Any, state_dict: dict | None) -> dict[str, torch.Tensor]:
    """The tensors ``model.save_pretrained`` saves: the state dict without the keys the
    model ignores on save, without tied duplicates, in the checkpoint's own names."""
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = dict(model.state_dict() if state_dict is None else state_dict)
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(key, None)
    state = remove_tied_weights_from_state_dict(state, model)
    return revert_weight_conversion(model, state)


def save_pretrained(
    model: Any,
    save_directory: PathLike,
    max_shard_size: int | str = "50GB",
    *,
    is_main_process: bool = True,
    state_dict: dict[str, torch.Tensor] | None = None,
    engine: Engine | None = None,
) -> None:
    """Saves ``model`` to ``save_directory`` as ``model.save_pretrained`` does, the weights
    through fastensor's engine: ``config.json`` (and ``generation_config.json`` for a
    generative model), then the weights: ``model.safetensors`` when they fit in
    ``max_shard_size`` (an int or ``"5GB"``-style, as transformers takes), else shards and
    ``model.safetensors.index.json``. Weight files of an earlier save that this one does not
    use are removed after it is durable. Only ``is_main_process`` writes.

    ``save_directory`` may be an object prefix (``s3://bucket/model``): every file is then an
    object under it (the JSON files as transformers writes them, each written whole; the
    weights as the engine saves objects), the earlier save's weight objects are found by
    listing the prefix, and nothing is created or left under the working directory.

    Raises:
        OSError: a file could not be written.
    """
    directory = fspath(save_directory)
    objects = not has_directories(directory)
    if not objects:
        if os.path.isfile(directory):
            raise FileExistsError(f"{directory}: a file, not a directory")
        os.makedirs(directory, exist_ok=True)
    limit = parse_size(max_shard_size)
    model.config.dtype = str(model.dtype).split(".")[1]
    model.config.architectures = [type(model).__name__]
    if not is_main_process:
        return
    state = _state_to_save(model, state_dict)
    if objects:
        _save_configs_as_objects(model, directory, engine)
    else:
        model.config.save_pretrained(directory)
        if model.can_generate():
            model.generation_config.save_pretrained(directory)
    state = {k: v.contiguous() for k, v in state.items()}
    total = sum(t.numel() * t.element_size() for t in state.values())
    meta = {"format": "pt"}
    names = _listing(directory, engine)
    if total <= limit:
        _fst.save_file(state, os.path.join(directory, _WEIGHTS), meta, engine=engine)
        stale = [_INDEX] + [f for f in names() if _SHARD.fullmatch(f)]
    else:
        _fst.save_sharded(state, directory, limit, meta, engine=engine)
        stale = [_WEIGHTS]  # would be read instead of the index
    for name in stale:  # (the index first: it must never name a removed shard)
        path = os.path.join(directory, name)
        if objects:
            _native.remove(engine_or_default(engine), path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _listing(directory: str, engine: Engine | None) -> Any:
    """A function giving the names in ``directory`` (a local directory, or an object prefix
    listed through ``engine``)."""
    if not has_directories(directory):
        return lambda: _native.list_names(engine_or_default(engine), directory)
    return lambda: os.listdir(directory)


def _save_configs_as_objects(model: Any, prefix: str, engine: Engine | None) -> None:
    """``config.json`` (and ``generation_config.json`` for a generative model) as objects
    under ``prefix``: what transformers' own ``save_pretrained`` of each writes (its checks
    and its files), made in a private temporary directory, removed after, and written
    whole as objects."""
    import tempfile

    native = engine_or_default(engine)
    with tempfile.TemporaryDirectory(prefix="fastensor-config-") as local:
        model.config.save_pretrained(local)
        if model.can_generate():
            model.generation_config.save_pretrained(local)
        for name in sorted(os.listdir(local)):
            with open(os.path.join(local, name), "rb") as f:
                data = f.read()
            _native.write_whole(native, os.path.join(prefix, name), data)
