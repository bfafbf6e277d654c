"""get_slice against safetensors itself: for every index safetensors 0.8 takes, fastensor's
slice (read in part, or verified: read whole and checked) gives the same tensor; for every
index it refuses, a SafetensorError. With torch, an index means what it means to torch
(clamped bounds, None, huge steps with torch's own arithmetic, lists and tensors); with
numpy, numpy's basic indexing, where safetensors' numpy side refuses some of it."""

import warnings

import fastensor
import fastensor.numpy as fn
import fastensor.torch as ft
import numpy as np
import pytest
import safetensors
import torch
from _indices import indices
from fastensor import SafetensorError
from hypothesis import given, settings
from hypothesis import strategies as st

TENSORS = {
    "m": torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "c": torch.arange(24, dtype=torch.int64).reshape(2, 3, 4),
    "v": torch.arange(5, dtype=torch.int16),
    "s": torch.tensor(7.5, dtype=torch.float64),
    "e": torch.empty(0, 3, dtype=torch.float32),
    "z": torch.empty(4, 0, 2, dtype=torch.uint8),
    "b": torch.arange(6).reshape(2, 3) % 2 == 0,
    "h": torch.arange(8, dtype=torch.bfloat16).reshape(2, 4),
}

#: Indices of every kind: clamped and huge bounds, None, huge and bad steps, ellipses,
#: lists, tensors, bools and types no framework takes.
CASES = [
    slice(None),
    (),
    ...,
    (..., ...),
    (..., ..., slice(None)),
    (..., ..., None, slice(None)),
    (..., ..., 0),
    0,
    -1,
    1,
    3,
    -4,
    -10,
    10,
    2**40,
    2**70,
    (0, 0),
    (0, -1),
    (0, 0, 0),
    (..., 0),
    (0, ..., 1),
    slice(1, 3),
    slice(0, 10),
    slice(5, 10),
    slice(-10, 2),
    slice(-1, None),
    slice(2, 1),
    slice(None, None, 2),
    slice(1, None, 3),
    slice(0, 3, 2**63),
    slice(0, 1, 2**63),
    slice(0, 2, 2**63 - 1),
    (slice(None), slice(0, 4, 2**63)),
    (slice(None), slice(0, 3, 2**63)),
    (slice(0, 0), slice(0, 3, 2**63)),
    (slice(None), slice(1, None, 2**62)),
    (0, ..., slice(1, 0, 2**62)),  # safetensors gives the whole last dimension
    slice(1, 0, 2**62),
    slice(0, 2**70),
    slice(-(2**70), 2),
    slice(2**64, None),
    slice(None, None, -1),
    slice(None, None, 0),
    None,
    (None,),
    (slice(None), None),
    (None, ..., None),
    (0, None, slice(1, 3)),
    [],
    [0],
    [[0, 2]],
    [0, 5],
    (slice(None), []),
    torch.tensor([1, 0]),
    torch.tensor(1),
    np.int64(1),
    True,
    False,
    (1, True),
    1.0,
    (slice(1.0, 2),),
    "a",
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """The tensors saved by fastensor with checksums (for verified opens), and the numpy
    ones (every dtype numpy has)."""
    d = tmp_path_factory.mktemp("parity")
    pt, np_ = d / "pt.safetensors", d / "np.safetensors"
    ft.save_file(TENSORS, pt, checksum=True)
    fn.save_file({k: v.numpy() for k, v in TENSORS.items() if k != "h"}, np_, checksum=True)
    return {"pt": pt, "np": np_}


def _outcome(read):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch warns of truncated huge steps)
            return "gave", read()
    except Exception as exc:
        return "refused", exc


def _theirs(path, framework: str, name: str, index):
    def read():
        with safetensors.safe_open(path, framework) as f:
            return f.get_slice(name)[index]

    return _outcome(read)


def _ours(path, framework: str, name: str, index, verify: bool):
    def read():
        with fastensor.safe_open(path, framework, verify=verify) as f:
            return f.get_slice(name)[index]

    return _outcome(read)


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return False
    return a.numel() <= 0 or torch.equal(a.contiguous(), b.contiguous())


def _has_bool(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, bool) for p in parts)


def _framework_gives(framework: str, name: str, index):
    """What the framework's own indexing of the tensor in memory gives (``None`` where it
    refuses the index)."""
    t = TENSORS[name]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return t[index] if framework == "pt" else t.numpy()[index]
    except Exception:
        return None


def _check(paths, framework: str, name: str, index) -> None:
    path = paths[framework]
    kind, want = _theirs(path, framework, name, index)
    truth = _framework_gives(framework, name, index)
    if kind == "gave" and truth is not None and tuple(truth.shape) != tuple(want.shape):
        # safetensors' own arithmetic overflowing (a step near 2**62 over an empty range
        # gives the whole dimension): the framework's indexing is the answer.
        want = truth.contiguous() if framework == "pt" else np.ascontiguousarray(truth)
    for verify in (False, True):
        what = f"{framework} `{name}`[{index!r}] verify={verify}"
        got_kind, got = _ours(path, framework, name, index, verify)
        if kind == "gave" and not (framework == "np" and _has_bool(index)):
            assert got_kind == "gave", f"{what}: refused ({got!r}); safetensors gives {want!r}"
            assert _equal(got, want), f"{what}: {got!r}, safetensors gives {want!r}"
            if framework == "pt":
                assert got.numel() <= 0 or got.is_contiguous(), what
        elif framework == "pt" or got_kind == "refused":
            # Refused by safetensors (or, with numpy, a bool, which safetensors takes for
            # an integer and numpy for a new axis): a SafetensorError naming the file.
            assert got_kind == "refused", f"{what}: {got!r}; safetensors refuses ({want!r})"
            assert isinstance(got, SafetensorError), f"{what}: {got!r}"
            assert got.path == str(path), what
        else:
            # safetensors' numpy side refuses bounds past the end, negative bounds and None;
            # fastensor gives what numpy gives.
            array = TENSORS[name].numpy()
            assert _equal(got, array[index].copy()), f"{what}: {got!r}"


@pytest.mark.parametrize("framework", ["pt", "np"])
@pytest.mark.parametrize("name", sorted(TENSORS))
def test_every_kind_of_index_gives_what_safetensors_gives(paths, framework, name):
    if framework == "np" and name == "h":
        pytest.skip("numpy has no bfloat16")
    for index in CASES:
        _check(paths, framework, name, index)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_indices_give_what_safetensors_gives(paths, data):
    framework = data.draw(st.sampled_from(["pt", "np"]))
    names = sorted(TENSORS) if framework == "pt" else sorted(set(TENSORS) - {"h"})
    name = data.draw(st.sampled_from(names))
    index = data.draw(indices(TENSORS[name].shape))
    _check(paths, framework, name, index)


def test_a_slice_refused_names_the_file_and_the_tensor_and_is_the_builtin_torch_raises(paths):
    with ft.safe_open(paths["pt"]) as f:
        s = f.get_slice("m")
        with pytest.raises(SafetensorError) as err:
            s[0 : 3 : 2**63]
        assert "`m`" in str(err.value) and str(paths["pt"]) in str(err.value)
        for index in (10, -4, (0, 0, 0), 1.0):
            with pytest.raises(IndexError):  # also a SafetensorError
                s[index]
        with pytest.raises(TypeError):
            s[1.0:2]
        with pytest.raises(ValueError):
            s[::-1]
        # The bytes a strided part covers are read, not the tensor: a part of a huge step
        # holds one row.
        assert torch.equal(s[1 : 3 : 2**62], TENSORS["m"][1:2])
