"""``save_model`` and ``load_model`` for PyTorch (exported by :mod:`fastensor.torch`):
a module's state dict saved and loaded with shared (tied) tensors handled as
``safetensors.torch`` handles them: one of each group of names sharing memory is saved, the
others recorded in the metadata, and not reported missing on load."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import torch

from ._common import PathLike, fspath
from ._engine import Engine
from ._torch_io import load_into, save_file
from ._torch_shared import _find_shared_tensors, _is_complete
from .errors import _invalid


def _remove_duplicate_names(
    state: Mapping[str, torch.Tensor],
    *,
    preferred_names: Iterable[str] | None = None,
    discard_names: Iterable[str] | None = None,
) -> dict[str, list[str]]:
    """For each group of shared tensors, the name kept (the first covering its whole storage,
    a preferred one where there is one) and the names dropped, as safetensors chooses."""
    preferred_set = set(preferred_names or ())
    discard_set = set(discard_names or ())
    to_remove: dict[str, list[str]] = defaultdict(list)
    for shared in _find_shared_tensors(state):
        complete = {n for n in shared if _is_complete(state[n])}
        if not complete:
            raise RuntimeError(
                f"Error while trying to find names to remove to save state dict: none of {shared}"
                " covers its entire storage; refusing to save or load the model, since it could"
                " store much more memory than needed (see"
                " https://huggingface.co/docs/safetensors/torch_shared_tensors)."
            )
        keep = sorted(complete)[0]
        preferred = complete - discard_set
        if preferred:
            keep = sorted(preferred)[0]
        if preferred_set:
            preferred = preferred_set & complete
            if preferred:
                keep = sorted(preferred)[0]
        for name in sorted(shared):
            if name != keep:
                to_remove[keep].append(name)
    return to_remove


def save_model(
    model: torch.nn.Module,
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    force_contiguous: bool = True,
    *,
    engine: Engine | None = None,
) -> None:
    """Saves ``model``'s ``state_dict()`` to ``filename``, as ``safetensors.torch.save_model``
    does: of tensors sharing memory (tied weights) only one name is kept, and each dropped name
    is recorded in the metadata as ``{dropped: kept}`` (where the caller's metadata does not
    already use that key). The save is :func:`save_file`'s, durable and atomic.

    With ``force_contiguous`` (the default here) a non-contiguous tensor is saved as its
    contiguous copy, as :func:`save_file` saves one; ``force_contiguous=False`` refuses it,
    as ``safetensors.torch.save_model`` does by default. ``metadata`` is not changed.

    Raises:
        RuntimeError: tensors share memory but none of them covers it whole.
        ValueError (InvalidInputError): with ``force_contiguous=False``, a non-contiguous
            tensor.
        TypeError, ValueError: as :func:`save_file`.
    """
    state = model.state_dict()
    meta = None if metadata is None else dict(metadata)
    for kept, dropped in _remove_duplicate_names(state).items():
        for name in dropped:
            if meta is None:
                meta = {}
            meta.setdefault(name, kept)
            del state[name]
    if force_contiguous:
        state = {k: v.contiguous() for k, v in state.items()}
    else:
        loose = [k for k, v in state.items() if not v.is_contiguous()]
        if loose:
            raise _invalid(
                f"{fspath(filename)}: tensors {loose} are not contiguous; with"
                " force_contiguous=False they are not copied: make them contiguous first, or"
                " use save_model(..., force_contiguous=True)",
                fspath(filename),
            )
    save_file(state, filename, meta, engine=engine)


def load_model(
    model: torch.nn.Module,
    filename: PathLike,
    strict: bool = True,
    device: str | int | torch.device = "cpu",
    *,
    engine: Engine | None = None,
) -> tuple[list[str], list[str]]:
    """Loads ``filename`` into ``model``, as ``safetensors.torch.load_model`` does: names the
    file lacks because they share memory with a name it holds (tied weights, as
    :func:`save_model` drops them) are not missing.

    The tensors are read straight into the model's own (see :func:`load_into`), wherever they
    are; ``device`` is accepted for compatibility. ``filename`` may also be a sharded
    checkpoint.

    Returns:
        ``(missing, unexpected)``: names of the model the file did not fill, and names of the
        file that were not used.

    Raises:
        RuntimeError: with ``strict`` (the default), missing or unexpected names (the model
            is loaded first, as in safetensors); any shape mismatch.
    """
    del device  # every tensor is read into the model's own memory
    result = load_into(model, filename, strict=False, engine=engine)
    state = model.state_dict()
    missing_set = set(result.missing_keys)
    in_file = [k for k in state if k not in missing_set] + list(result.unexpected_keys)
    unexpected = list(result.unexpected_keys)
    for dropped in _remove_duplicate_names(state, preferred_names=in_file).values():
        for name in dropped:
            if name in missing_set:
                missing_set.remove(name)
            else:
                unexpected.append(name)
    missing = [k for k in result.missing_keys if k in missing_set]
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {type(model).__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(missing)
            )
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(unexpected)
            )
        raise RuntimeError(error)
    return missing, unexpected
