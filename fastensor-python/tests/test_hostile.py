"""A hostile or careless caller: no call may crash the interpreter, hang, or write where it
must not. Every case ends in correct data or a typed error naming the file."""

import contextlib
import json
import os
import struct
import subprocess
import sys
import textwrap

import fastensor
import fastensor.numpy as fnp
import numpy as np
import pytest
import torch
from fastensor import _native, errors
from fastensor.torch import load_file, load_into, safe_open, save_file, save_file_async
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def write_raw(path, header, data=b""):
    """A safetensors-shaped file with any header at all."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.write(data)


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "a.safetensors"
    save_file({"a": torch.arange(1024, dtype=torch.float32)}, path)
    return path


# 2. Addresses cannot be passed from Python; every range is checked against its object.


def test_integers_are_refused_where_memory_is_expected(tmp_path, small):
    eng = _native.Engine()
    target = os.fspath(tmp_path / "x.safetensors")
    for call in (
        lambda: eng.save(target, [("a", "F32", [1024], 4096)]),
        lambda: eng.save_async(target, [("a", "F32", [1024], 4096)]),
        lambda: _native.save_sharded(eng, os.fspath(tmp_path / "d"), [("a", "F32", [1], 8)], 1),
        lambda: eng.open(os.fspath(small)).read_into([("a", 4096, 0, 4096)]),
        lambda: _native.read_ranges(eng, [(os.fspath(small), 0, 4096, 0, 4096)]),
    ):
        with pytest.raises(ValueError, match="no memory to lend"):
            call()
    # The old spec shapes, with an address and a length, do not even parse.
    with pytest.raises((TypeError, ValueError)):
        eng.save(target, [("a", "F32", [1024], 4096, 4096, -1)])
    with pytest.raises((TypeError, ValueError, OverflowError)):
        eng.open(os.fspath(small)).read_into([("a", 4096, 4096, -1)])
    assert not os.path.exists(target)


def test_a_destination_smaller_than_the_read_is_refused(small):
    f = _native.Engine().open(os.fspath(small))
    dst = torch.zeros(10)  # 40 bytes, the tensor is 4096
    with pytest.raises(ValueError, match="do not fit"):
        f.read_into([("a", dst, 0, 4096)])
    with pytest.raises(ValueError, match="do not fit"):
        f.read_into([("a", bytearray(4096), 1, 4096)])
    # A length that is not the tensor's: refused by the read, nothing written.
    dst = torch.zeros(2048)
    with pytest.raises(ValueError):
        f.read_into([("a", dst, 0, 1000)])
    assert not dst.any()


def test_overlapping_destinations_are_refused(tmp_path):
    path = tmp_path / "two.safetensors"
    save_file({"a": torch.ones(256), "b": torch.ones(256)}, path)
    f = _native.Engine().open(os.fspath(path))
    buf = torch.zeros(2048, dtype=torch.uint8)
    with pytest.raises(ValueError, match="share memory"):
        f.read_into([("a", buf, 0, 1024), ("b", buf, 500, 1024)])


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_read_only_destinations_are_refused(tmp_path, small):
    f = _native.Engine().open(os.fspath(small))
    frozen = np.zeros(1024, dtype=np.float32)
    frozen.flags.writeable = False
    raw = tmp_path / "raw.bin"
    np.zeros(4096, np.uint8).tofile(raw)
    mapped = np.memmap(raw, mode="r")
    mapped_tensor = torch.from_numpy(np.memmap(raw, mode="r"))
    for dst in (
        frozen,
        mapped,
        mapped_tensor,
        b"\0" * 4096,
        memoryview(bytearray(4096)).toreadonly(),
    ):
        with pytest.raises(ValueError):
            f.read_into([("a", dst, 0, 4096)])
    # Through the public API too: load_into a read-only mapping.
    target = {"a": torch.from_numpy(np.memmap(raw, mode="r")).view(torch.float32)}
    with pytest.raises(ValueError, match="not writable"):
        load_into(target, small)
    assert raw.read_bytes() == bytes(4096)


class _ReadOnlyExport:
    """An object whose DLPack export is flagged read-only (torch's ``read_only=True``)."""

    def __init__(self, t: torch.Tensor):
        self.t = t

    def __dlpack__(self, **kwargs):
        return self.t.__dlpack__(**{**kwargs, "read_only": True})


@pytest.mark.filterwarnings("ignore:The given")
def test_destinations_are_refused_exactly_where_their_memory_says_read_only(tmp_path, small):
    # What docs/reliability.md lists as refused: a read-only numpy array or memoryview, bytes, a
    # DLPack export flagged read-only, host memory not mapped writable.
    f = _native.Engine().open(os.fspath(small))
    frozen = np.zeros(4096, np.uint8)
    frozen.flags.writeable = False
    raw = tmp_path / "raw.bin"
    np.zeros(4096, np.uint8).tofile(raw)
    for dst in (
        frozen,
        memoryview(bytearray(4096)).toreadonly(),
        b"\0" * 4096,
        _ReadOnlyExport(torch.zeros(4096, dtype=torch.uint8)),
        np.memmap(raw, mode="r"),
        torch.from_numpy(np.memmap(raw, mode="r")),
    ):
        with pytest.raises(ValueError, match="read-only|not writable|writable"):
            f.read_into([("a", dst, 0, 4096)])
    # And what it says is written: a torch tensor carries no read-only mark, so one over a
    # read-only buffer in writable memory is written, as torch's own copy_ writes it.
    want = torch.arange(1024, dtype=torch.float32)
    for t in (
        torch.frombuffer(bytes(4096), dtype=torch.float32),
        torch.from_numpy(np.frombuffer(bytes(4096), dtype=np.float32)),
    ):
        load_into({"a": t}, small)
        assert torch.equal(t, want)


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
def test_large_read_only_destinations_are_refused_and_writable_ones_left_as_they_were(tmp_path):
    # Beyond a few pages the check reads the process's mappings instead of probing pages.
    n = 1 << 20
    path = tmp_path / "big.safetensors"
    save_file({"a": torch.ones(n // 4)}, path)
    f = _native.Engine().open(os.fspath(path))
    raw = tmp_path / "raw.bin"
    np.zeros(n, np.uint8).tofile(raw)
    for dst in (np.memmap(raw, mode="r"), torch.from_numpy(np.memmap(raw, mode="r"))):
        with pytest.raises(ValueError, match="read-only|not writable"):
            f.read_into([("a", dst, 0, n)])
    assert raw.read_bytes() == bytes(n)
    # A refused call leaves a writable destination untouched (the probe writes nothing new).
    small = torch.full((1024,), 7, dtype=torch.uint8)
    with pytest.raises(ValueError):
        f.read_into([("a", small, 0, 1024)])  # not the tensor's length
    assert bool((small == 7).all())


def test_offload_store_takes_the_tensor_not_an_address(tmp_path):
    eng = fastensor.Engine()
    store = _native.OffloadStore(eng._native, os.fspath(tmp_path), 1 << 20)
    small = torch.arange(4, dtype=torch.float32)  # 16 bytes
    with pytest.raises(TypeError):
        store.put(small, small.data_ptr(), 1 << 16, "x")
    for not_memory in (small.data_ptr(), bytearray(16)):
        with pytest.raises(ValueError, match="must export DLPack"):
            store.put(not_memory, "x")
    h = store.put(small.view(torch.uint8), "x")
    assert h.nbytes == 16
    back = torch.from_dlpack(store.get(h))
    assert back.numel() == 16
    assert torch.equal(back.view(torch.float32), small)
    store.close()


def test_engine_is_configuration_only():
    eng = fastensor.Engine(backends=["posix"])
    for name in ("save", "save_async", "open", "read_into"):
        assert not hasattr(eng, name)
    assert eng.backend_names() == ["posix"]
    with pytest.raises(TypeError, match="fastensor.Engine"):
        load_file("x.safetensors", engine=_native.Engine())


# 7-8. Background saves: ordered per path, never dropped silently at exit.


def test_background_saves_to_one_path_land_in_order(tmp_path):
    path = tmp_path / "m.safetensors"
    for _ in range(6):
        handles = [save_file_async({"v": torch.full((1 << 18,), float(i))}, path) for i in range(4)]
        for h in handles:
            h.wait()
        assert load_file(path)["v"][0].item() == 3.0


def test_the_interpreter_waits_at_exit_for_saves_not_waited_for(tmp_path):
    path = tmp_path / "m.safetensors"
    code = textwrap.dedent(
        f"""
        import torch
        from fastensor.torch import save_file_async
        save_file_async({{"v": torch.ones(1 << 22)}}, {os.fspath(path)!r})
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "not waited for" in out.stderr
    assert torch.equal(load_file(path)["v"], torch.ones(1 << 22))


# 9. Errors name the file and the tensor.


def test_a_shape_torch_cannot_hold_is_a_typed_error(tmp_path):
    path = tmp_path / "z.safetensors"
    write_raw(
        path, {"a": {"dtype": "F32", "shape": [0] + [2**32 - 1] * 62, "data_offsets": [0, 0]}}
    )
    for load in (load_file, fnp.load_file):
        with pytest.raises(errors.FastensorError) as err:
            load(path)
        assert "z.safetensors" in str(err.value) and "`a`" in str(err.value)


def test_a_tensor_larger_than_memory_is_a_typed_error(tmp_path):
    path = tmp_path / "big.safetensors"
    n = 40 * 10**9
    write_raw(path, {"a": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}})
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) + n)  # sparse: no disk space used
    with pytest.raises((MemoryError, ValueError)) as err:
        load_file(path)
    assert isinstance(err.value, errors.FastensorError)
    assert "big.safetensors" in str(err.value) and "`a`" in str(err.value)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_tensors_without_dense_data_are_refused_by_name(tmp_path):
    path = tmp_path / "n.safetensors"
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    for bad in (nested, torch.ones(2).to_sparse(), torch.empty(4, device="meta")):
        with pytest.raises(ValueError) as err:
            save_file({"t": bad}, path)
        assert isinstance(err.value, errors.FastensorError)
        assert err.value.path == str(path)
        assert "`t`" in str(err.value) or "`['t']`" in str(err.value)  # (safetensors' words)
    assert not path.exists()


# Property-based: random files and random arguments into every public call.

_DTYPES = ["F32", "F16", "BF16", "I64", "U8", "BOOL", "F64", "I8", "XX", "", 3]
_values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=8),
    st.none(),
    st.lists(st.integers(min_value=-5, max_value=2**40), max_size=4),
)
_entry = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(_DTYPES),
        "shape": st.one_of(
            st.lists(st.integers(min_value=-2, max_value=2**40), max_size=5), _values
        ),
        "data_offsets": st.one_of(
            st.lists(st.integers(min_value=-2, max_value=2**40), min_size=0, max_size=3), _values
        ),
    }
)
_header = st.one_of(
    st.dictionaries(st.text(max_size=6), st.one_of(_entry, _values), max_size=5),
    st.binary(max_size=64),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(header=_header, data=st.binary(max_size=256), length_fix=st.booleans())
def test_random_files_load_or_raise_typed_errors(tmp_path, header, data, length_fix):
    path = tmp_path / "r.safetensors"
    write_raw(path, header, data)
    if not length_fix:  # a lying header length
        with open(path, "r+b") as f:
            f.write(struct.pack("<Q", 2**63 + len(data)))
    for call in (
        lambda: load_file(path),
        lambda: fnp.load_file(path),
        lambda: safe_open(path, framework="pt").keys(),
        lambda: load_into({"a": torch.zeros(4)}, path, strict=False),
    ):
        try:
            call()
        except (errors.FastensorError, TypeError, ValueError) as exc:
            assert isinstance(exc, OSError | ValueError | RuntimeError | MemoryError | TypeError)


_junk = st.one_of(
    _values,
    st.binary(max_size=16),
    st.builds(lambda n: torch.zeros(n, dtype=torch.uint8), st.integers(0, 64)),
    st.builds(lambda n: np.zeros(n, dtype=np.uint8), st.integers(0, 64)),
    st.builds(lambda n: torch.zeros(n, 3).t(), st.integers(2, 8)),  # not contiguous
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    spec=st.tuples(st.text(max_size=3), st.sampled_from(_DTYPES), _values, _junk),
    target=st.tuples(st.sampled_from(["a", "b", ""]), _junk, _values, _values),
)
def test_random_native_arguments_raise_and_never_crash(tmp_path, small, spec, target):
    eng = _native.Engine(backends=["posix"])
    out = os.fspath(tmp_path / "o.safetensors")
    f = eng.open(os.fspath(small))
    for call in (
        lambda: eng.save(out, [spec]),
        lambda: eng.save_async(out, [spec]).wait(),
        lambda: f.read_into([target]),
        lambda: _native.read_ranges(eng, [(os.fspath(small), 0, *target[1:])]),
    ):
        with contextlib.suppress(errors.FastensorError, TypeError, ValueError, OverflowError):
            call()
