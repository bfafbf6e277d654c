"""What an index of ``safe_open(...).get_slice(name)[index]`` selects of a tensor.

An index means what it means to the framework the file was opened for:

* ``framework="pt"``: what it means to torch for a tensor of that shape and dtype, as in
  ``safetensors`` 0.8, which indexes a torch view of the tensor. The index is applied to a
  tensor on torch's ``meta`` device (a shape without data), so that torch itself decides
  every rule: clamped bounds, ``None``, ``...``, huge steps (with torch's own arithmetic),
  and what it refuses. A result that is a view (basic indexing) is a :class:`Strided`
  part, read as the byte runs it covers; any other (advanced indexing: lists, tensors,
  masks) is a :class:`Gathered` part, taken from the whole tensor.
* ``framework="np"``: numpy's basic indexing: integers (negative ones count from the end),
  slices with a positive step (bounds clamped as Python clamps them), ``None`` and
  ``...``; an empty list selects no rows. Anything else (a negative step, a ``bool``,
  another list or an array) is refused.

What an index refuses is an :class:`~fastensor.errors.InvalidInputError` (a
``SafetensorError`` and a ``ValueError``); one out of a dimension's range is also an
``IndexError`` (:class:`~fastensor.errors.SliceIndexError`), one of the wrong type a
``TypeError``. Messages name the file, the tensor and its shape.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInputError, SliceIndexError, WrongTypeError, _invalid

#: The file and the tensor an index is applied to (errors name both).
Where = tuple[str, str]

#: What a part keeps of one dimension of the tensor: ``count`` indices from ``start``,
#: ``step`` apart (``step`` is 1 where ``count`` is at most 1).
Selection = tuple[int, int, int]


@dataclass(frozen=True)
class Strided:
    """A part of a tensor that is a strided view of it: one :data:`Selection` per
    dimension of the tensor, and the shape of the result (which drops the dimensions an
    integer selected and adds the ones ``None`` added). Its elements, row-major over the
    selections, are the result's, row-major."""

    selection: list[Selection]
    shape: list[int]

    @property
    def empty(self) -> bool:
        return any(count == 0 for _, count, _ in self.selection)


@dataclass(frozen=True)
class Gathered:
    """A part of a tensor that only indexing the whole tensor gives (torch's advanced
    indexing): ``index`` applied to the whole tensor; ``shape`` is the result's (``None``
    where only the whole tensor tells)."""

    index: Any
    shape: list[int] | None


def _described(index: Any) -> str:
    """``index`` as it appears in an error message."""

    def one(part: Any) -> str:
        if isinstance(part, slice):
            text = ("" if part.start is None else str(part.start)) + ":"
            text += "" if part.stop is None else str(part.stop)
            if part.step is not None:
                text += f":{part.step}"
            return text
        return "..." if part is Ellipsis else repr(part)

    parts = index if isinstance(index, tuple) else (index,)
    return f"[{', '.join(map(one, parts))}]"


def _refused(where: Where, index: Any, shape: Sequence[int], why: object, cls=InvalidInputError):
    path, name = where
    return _invalid(
        f"{path}: tensor `{name}`: cannot slice {_described(index)} of shape {list(shape)}: {why}",
        path,
        cls,
    )


def _refusal_class(exc: BaseException) -> type[InvalidInputError]:
    if isinstance(exc, IndexError):
        return SliceIndexError
    if isinstance(exc, TypeError):
        return WrongTypeError
    return InvalidInputError


# torch: the index resolved by torch on a meta tensor.


def resolve_torch(index: Any, shape: Sequence[int], dtype: Any, where: Where) -> Strided | Gathered:
    """What torch's ``tensor[index]`` selects of a tensor of ``shape`` and torch ``dtype``
    (see the module). ``where`` (the file and the tensor) is named in errors.

    Raises:
        SafetensorError (InvalidInputError, SliceIndexError, WrongTypeError): an index
            torch refuses for that shape, with torch's reason.
    """
    import torch

    meta = torch.empty(tuple(shape), dtype=dtype, device="meta")
    try:
        part = meta[index]
    except Exception as exc:  # torch says why: out of range, a bad type, a zero step...
        parts = index if isinstance(index, tuple) else (index,)
        if sum(1 for p in parts if p is Ellipsis) < 2:
            raise _refused(where, index, shape, exc, _refusal_class(exc)) from exc
        # Two ellipses reach past the last dimension, where torch's CPU indexing skips the
        # checks of a whole slice (`:`) that the meta device makes: where a CPU tensor
        # takes the index, the part is taken from the whole tensor.
        on_broadcast(index, shape, dtype, where)
        return Gathered(index, None)
    out = list(part.shape)
    if (part is meta or part._base is meta) and min(out, default=0) >= 0:
        selection = _from_view(out, part.stride(), part.storage_offset(), shape)
        if selection is not None:
            return Strided(selection, out)
    return Gathered(index, out)


def _from_view(
    sizes: Sequence[int], strides: Sequence[int], offset: int, shape: Sequence[int]
) -> list[Selection] | None:
    """The selections of a view (``sizes``, ``strides``, ``offset`` in elements) of a
    contiguous tensor of ``shape``; ``None`` when the view is not one basic indexing
    makes (the caller then gathers instead).

    Each dimension of the view with more than one element walks one dimension ``d`` of the
    tensor, in order, with a stride that is a multiple of ``d``'s (the step) and less than
    ``d``'s size times it; the offset, in the tensor's mixed radix, gives every start.
    """
    rank = len(shape)
    if any(n == 0 for n in sizes) or any(n == 0 for n in shape):
        return [(0, 0, 1)] + [(0, n, 1) for n in shape[1:]] if rank else None
    inner = [1] * rank
    for d in range(rank - 2, -1, -1):
        inner[d] = inner[d + 1] * shape[d + 1]
    starts, rest = [], offset
    for d in range(rank):
        starts.append(rest // inner[d])
        rest %= inner[d]
    counts, steps = [1] * rank, [1] * rank
    last = -1
    for size, stride in zip(sizes, strides, strict=True):
        if size == 1:
            continue
        d = next((d for d in range(rank) if inner[d] <= stride < inner[d] * shape[d]), None)
        if d is None or d <= last or stride % inner[d]:
            return None
        counts[d], steps[d], last = size, stride // inner[d], d
    selection = [(s, c, st if c > 1 else 1) for s, c, st in zip(starts, counts, steps, strict=True)]
    for (s, c, st), n in zip(selection, shape, strict=True):
        if s < 0 or s + (c - 1) * st >= n:
            return None
    return selection


def on_broadcast(index: Any, shape: Sequence[int], dtype: Any, where: Where) -> Any:
    """``index`` applied by torch's CPU indexing to one element broadcast to ``shape``
    (no tensor of that size): what torch refuses whatever the strides (the values of an
    advanced index checked too; not what only the strides of a contiguous tensor make it
    refuse, which the meta device checks). For a part of an index the meta device took
    that holds no element, the part itself (a dimension may even be negative, as torch's
    arithmetic for huge steps makes it).

    Raises:
        SafetensorError: as :func:`resolve_torch`.
    """
    import torch

    try:
        return torch.zeros((), dtype=dtype).expand(tuple(shape))[index]
    except Exception as exc:
        raise _refused(where, index, shape, exc, _refusal_class(exc)) from exc


def take_gathered(whole: Any, part: Gathered, where: Where) -> Any:
    """``part`` of ``whole`` (a torch tensor), as a new contiguous tensor."""
    try:
        out = whole[part.index]
    except Exception as exc:
        raise _refused(where, part.index, list(whole.shape), exc, _refusal_class(exc)) from exc
    return _owned(out) if out._base is not None else out.contiguous()


# numpy: basic indexing resolved here.


def resolve_numpy(index: Any, shape: Sequence[int], where: Where) -> Strided:
    """What numpy's basic indexing ``array[index]`` selects of an array of ``shape`` (see
    the module; also torch's packed dtypes, indexed in the file's logical shape).

    Raises:
        SafetensorError (InvalidInputError, SliceIndexError, WrongTypeError): an index of
            a kind not supported, or out of range.
    """
    if isinstance(index, list):
        if index:
            raise _invalid("Non empty lists are not implemented", where[0])
        index = slice(0, 0)
    parts = list(index) if isinstance(index, tuple) else [index]
    consumed = sum(1 for p in parts if p is not None and p is not Ellipsis)
    if sum(1 for p in parts if p is Ellipsis) > 1:
        raise _refused(where, index, shape, "an index can only have a single ellipsis ('...')")
    if consumed > len(shape):
        why = f"too many indices for a tensor of {len(shape)} dimensions"
        raise _refused(where, index, shape, why, SliceIndexError)
    selection: list[Selection] = []
    out: list[int] = []
    for part in parts:
        if part is None:
            out.append(1)
        elif part is Ellipsis:
            for _ in range(len(shape) - consumed):
                size = shape[len(selection)]
                selection.append((0, size, 1))
                out.append(size)
        elif isinstance(part, slice):
            start, count, step = _numpy_slice(part, shape[len(selection)], where, index, shape)
            selection.append((start, count, step))
            out.append(count)
        else:
            selection.append((_numpy_int(part, len(selection), where, index, shape), 1, 1))
    for size in shape[len(selection) :]:
        selection.append((0, size, 1))
        out.append(size)
    return Strided(selection, out)


def _numpy_slice(part: slice, size: int, where: Where, index: Any, shape) -> Selection:
    if part.step is not None and not isinstance(part.step, bool):
        with contextlib.suppress(TypeError):
            if operator.index(part.step) <= 0:
                what = "negative steps are" if operator.index(part.step) else "a step of 0 is"
                raise _refused(where, index, shape, f"{what} not supported")
    try:
        start, stop, step = part.indices(size)
    except (TypeError, ValueError) as exc:
        raise _refused(where, index, shape, exc, _refusal_class(exc)) from exc
    count = len(range(start, stop, step))
    return (start, count, step) if count > 1 else (min(start, size), count, 1)


def _numpy_int(part: Any, dim: int, where: Where, index: Any, shape) -> int:
    try:
        if isinstance(part, bool):
            raise TypeError("a bool")
        i = operator.index(part)
    except TypeError as exc:
        why = (
            "only integers, slices (`:`), `...`, `None` and an empty list are valid indices,"
            f" not {type(part).__name__}"
        )
        raise _refused(where, index, shape, why, WrongTypeError) from exc
    size = shape[dim]
    # (worded as safetensors words these refusals)
    if i < -size:
        message = f"Invalid index {i} for dimension {dim} of size {size}"
        raise _invalid(message, where[0], SliceIndexError)
    if i >= size:
        message = (
            f"Error during slicing {_described(index)} with shape {list(shape)}: index {i} out"
            f" of bounds for tensor dimension #{dim} of size {size}"
        )
        raise _invalid(message, where[0], SliceIndexError)
    return i + size if i < 0 else i


def take_strided(whole: Any, part: Strided) -> Any:
    """``part`` of ``whole`` (a torch tensor or numpy array of the tensor's shape), as a
    new contiguous tensor or array of the part's shape."""
    index = tuple(slice(s, s + c * st, st) for s, c, st in part.selection)
    return _owned(whole[index]).reshape(part.shape)


def _owned(part: Any) -> Any:
    """A contiguous copy of ``part`` (a torch tensor or numpy array)."""
    if hasattr(part, "clone"):
        import torch

        return part.clone(memory_format=torch.contiguous_format)
    import numpy as np

    return np.array(part, order="C", copy=True)  # (a 0-d array, not a numpy scalar)
