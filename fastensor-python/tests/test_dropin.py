"""fastensor as a drop-in for safetensors: in-memory save/load, save_model/load_model,
serialize/deserialize, each checked against safetensors itself."""

import json
import struct

import fastensor
import fastensor.numpy as fn
import fastensor.torch as ft
import numpy as np
import pytest
import safetensors
import safetensors.numpy as sn
import safetensors.torch as st
import torch
from fastensor.errors import CorruptError
from fastensor.torch import _TO_NAME


def _all_dtypes() -> dict[str, torch.Tensor]:
    """A tensor of every dtype torch and safetensors share (F4 packed two to an element),
    plus zero-size and 0-d ones; their bytes are a pattern (floats may hold any bits)."""
    out = {}
    for dt, name in _TO_NAME.items():
        if dt == torch.bool:
            t = torch.arange(12).reshape(3, 4) % 3 == 0
        else:
            raw = torch.arange(12 * dt.itemsize, dtype=torch.int64) * 37 % 251
            t = raw.to(torch.uint8).view(dt).reshape(3, 4)
        out[f"t_{name}"] = t
        if name != "F4":  # (a 0-d packed tensor holds two values: refused)
            out[f"scalar_{name}"] = t[1, 1].clone()
        out[f"empty_{name}"] = torch.empty(0, 4, dtype=dt)
    out["noncontiguous"] = torch.arange(12.0).reshape(3, 4).t()
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
    )


def _header(data: bytes) -> dict:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])


def _raw(header: object, body: bytes = b"", *, length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + body


# torch: save / load


def test_torch_round_trip_every_dtype():
    tensors = _all_dtypes()
    loaded = ft.load(ft.save(tensors))
    assert set(loaded) == set(tensors)
    for k, v in tensors.items():
        assert _same(loaded[k], v), k
        assert loaded[k].is_contiguous()


def test_torch_bytes_identical_to_safetensors():
    tensors = {k: v.contiguous() for k, v in _all_dtypes().items()}
    assert ft.save(tensors) == st.save(tensors)
    meta = {"format": "pt"}
    assert ft.save(tensors, metadata=meta) == st.save(tensors, metadata=meta)
    assert ft.save({}) == st.save({})


def test_torch_cross_compatible_both_ways():
    # (the dtypes this safetensors' torch loader knows)
    known = set(getattr(st, "_TYPES", {}).values()) or set(_TO_NAME)
    tensors = {k: v.contiguous() for k, v in _all_dtypes().items() if v.dtype in known}
    theirs = st.load(ft.save(tensors, metadata={"a": "b"}))
    ours = ft.load(st.save(tensors, metadata={"a": "b"}))
    for k, v in tensors.items():
        assert _same(theirs[k], v), k
        assert _same(ours[k], v), k


def test_torch_load_owns_writable_memory():
    data = ft.save({"w": torch.ones(4)})
    t = ft.load(data)["w"]
    t += 1  # not a view of the immutable bytes
    assert torch.equal(ft.load(data)["w"], torch.ones(4))
    assert ft.load(bytearray(data))["w"].sum() == 4
    assert ft.load(memoryview(data))["w"].sum() == 4


def test_torch_load_metadata_is_kept():
    data = ft.save({"w": torch.ones(2)}, metadata={"k": "v"})
    assert _header(data)["__metadata__"] == {"k": "v"}
    assert ft.load(data)["w"].tolist() == [1.0, 1.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_torch_load_to_cuda_and_save_from_cuda():
    tensors = {"a": torch.arange(10.0, device="cuda"), "b": torch.ones(3, dtype=torch.bfloat16)}
    data = ft.save(tensors)
    assert data == st.save({k: v.cpu() for k, v in tensors.items()})
    loaded = ft.load(data, device=0)
    assert loaded["a"].device.type == "cuda"
    assert torch.equal(loaded["a"].cpu(), tensors["a"].cpu())


def test_torch_save_refuses_what_safetensors_refuses():
    with pytest.raises(TypeError):
        ft.save({"a": [1, 2]})
    with pytest.raises(ValueError):
        ft.save({"a": torch.ones(2, dtype=torch.complex128)})
    with pytest.raises(ValueError):
        ft.save({"a": torch.eye(3).to_sparse()})
    with pytest.raises(TypeError):
        ft.save({"a": torch.ones(1)}, metadata={"k": 1})


# numpy: save / load

_NP = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.float16, np.int32, np.uint32]
_NP += [np.float32, np.int64, np.uint64, np.float64]


def _np_arrays() -> dict[str, np.ndarray]:
    out = {}
    for dt in _NP:
        a = (np.arange(12) % 5).reshape(3, 4).astype(dt)
        out[f"a_{np.dtype(dt).name}"] = a
        out[f"s_{np.dtype(dt).name}"] = np.array(a[1, 1])
        out[f"e_{np.dtype(dt).name}"] = np.empty((2, 0), dtype=dt)
    return out


def test_numpy_round_trip_and_bytes_identical():
    arrays = _np_arrays()
    data = fn.save(arrays, metadata={"k": "v"})
    assert data == sn.save(arrays, metadata={"k": "v"})
    loaded = fn.load(data)
    assert set(loaded) == set(arrays)
    for k, v in arrays.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, k
        np.testing.assert_array_equal(loaded[k], v)
        assert loaded[k].flags.writeable


def test_numpy_cross_compatible_both_ways():
    arrays = _np_arrays()
    arrays["big_endian"] = np.arange(5, dtype=">i4")
    arrays["strided"] = np.arange(12.0).reshape(3, 4)[:, ::2]
    theirs = sn.load(fn.save(arrays))
    ours = fn.load(sn.save({k: np.ascontiguousarray(v) for k, v in arrays.items()}))
    for k, v in arrays.items():
        np.testing.assert_array_equal(theirs[k], v)
        np.testing.assert_array_equal(ours[k], v)


def test_numpy_load_of_a_dtype_numpy_lacks():
    with pytest.raises(ValueError, match="BF16"):
        fn.load(ft.save({"x": torch.ones(2, dtype=torch.bfloat16)}))


# save_model / load_model


class Tied(torch.nn.Module):
    def __init__(self, tie: bool = True):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.body = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.register_buffer("scale", torch.tensor(2.0))
        if tie:
            self.head.weight = self.embed.weight


def _state_equal(a: torch.nn.Module, b: torch.nn.Module, skip: tuple[str, ...] = ()) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        if k not in skip:
            assert torch.equal(sa[k], sb[k]), k


def test_save_model_matches_safetensors(tmp_path):
    torch.manual_seed(0)
    model = Tied()
    meta = {"user": "data"}
    ft.save_model(model, tmp_path / "ours.safetensors", metadata=meta)
    st.save_model(model, str(tmp_path / "theirs.safetensors"), metadata=dict(meta))
    assert meta == {"user": "data"}  # the caller's dict is not changed
    ours = st.load_file(tmp_path / "ours.safetensors")
    theirs = st.load_file(tmp_path / "theirs.safetensors")
    assert set(ours) == set(theirs) and "head.weight" not in ours
    for k in theirs:
        assert torch.equal(ours[k], theirs[k])
    with safetensors.safe_open(tmp_path / "ours.safetensors", "pt") as f:
        ours_meta = f.metadata()
    with safetensors.safe_open(tmp_path / "theirs.safetensors", "pt") as f:
        assert ours_meta == f.metadata() == {"user": "data", "head.weight": "embed.weight"}


@pytest.mark.parametrize("writer", ["fastensor", "safetensors"])
def test_load_model_tied_matches_safetensors(tmp_path, writer):
    torch.manual_seed(1)
    src = Tied()
    path = tmp_path / "m.safetensors"
    (ft.save_model if writer == "fastensor" else st.save_model)(src, str(path))
    ours, theirs = Tied(), Tied()
    got = ft.load_model(ours, path)
    want = st.load_model(theirs, str(path))
    assert sorted(got[0]) == sorted(want[0]) == []
    assert sorted(got[1]) == sorted(want[1]) == []
    _state_equal(ours, src)
    _state_equal(ours, theirs)
    assert ours.head.weight.data_ptr() == ours.embed.weight.data_ptr()


def test_load_model_reports_as_safetensors_does(tmp_path):
    torch.manual_seed(2)
    # An untied model saved, loaded into a tied one: head.weight is unexpected.
    path = tmp_path / "untied.safetensors"
    ft.save_model(Tied(tie=False), path)
    ours, theirs = Tied(), Tied()
    got = ft.load_model(ours, path, strict=False)
    want = st.load_model(theirs, str(path), strict=False)
    assert sorted(got[0]) == sorted(want[0])
    assert sorted(got[1]) == sorted(want[1]) == ["head.weight"]
    with pytest.raises(RuntimeError, match="Unexpected key"):
        ft.load_model(Tied(), path)
    # A tied model saved, loaded into an untied one: head.weight is missing.
    path = tmp_path / "tied.safetensors"
    ft.save_model(Tied(), path)
    ours, theirs = Tied(tie=False), Tied(tie=False)
    got = ft.load_model(ours, path, strict=False)
    want = st.load_model(theirs, str(path), strict=False)
    assert sorted(got[0]) == sorted(want[0]) == ["head.weight"]
    assert sorted(got[1]) == sorted(want[1]) == []
    _state_equal(ours, theirs, skip=("head.weight",))  # (not in the file: left as it was)
    with pytest.raises(RuntimeError, match="Missing key"):
        ft.load_model(Tied(tie=False), path)


def test_load_model_prefers_the_name_in_the_file(tmp_path):
    torch.manual_seed(3)
    src = Tied()
    state = src.state_dict()
    del state["embed.weight"]  # the other name of the tied pair
    path = tmp_path / "m.safetensors"
    st.save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    ours, theirs = Tied(), Tied()
    assert ft.load_model(ours, path) == ([], [])
    assert tuple(map(list, st.load_model(theirs, str(path)))) == ([], [])
    _state_equal(ours, src)


def test_save_model_non_contiguous(tmp_path):
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight = torch.nn.Parameter(torch.randn(4, 3).t())
    assert not model.weight.is_contiguous()
    # Without force_contiguous, a non-contiguous tensor is refused (as safetensors does).
    with pytest.raises(ValueError, match=r"save_model\(\.\.\., force_contiguous=True\)"):
        ft.save_model(model, tmp_path / "m.safetensors", force_contiguous=False)
    ft.save_model(model, tmp_path / "m.safetensors", force_contiguous=True)
    back = torch.nn.Linear(4, 3)
    ft.load_model(back, tmp_path / "m.safetensors")
    _state_equal(back, model)


# serialize / deserialize


def test_serialize_matches_safetensors_layout(tmp_path):
    arrays = _np_arrays()
    spec = {
        k: {"dtype": v.dtype.name, "shape": list(v.shape), "data": v.tobytes()}
        for k, v in arrays.items()
    }
    data = fastensor.serialize(spec, metadata={"k": "v"})
    assert data == sn.save(arrays, metadata={"k": "v"})
    back = dict(fastensor.deserialize(data))
    theirs = dict(safetensors.deserialize(data))
    assert set(back) == set(theirs)
    for k, v in theirs.items():
        assert back[k]["dtype"] == v["dtype"] and back[k]["shape"] == v["shape"]
        assert bytes(back[k]["data"]) == bytes(v["data"])
    fastensor.serialize_file(spec, tmp_path / "s.safetensors")
    loaded = sn.load_file(tmp_path / "s.safetensors")
    for k, v in arrays.items():
        np.testing.assert_array_equal(loaded[k], v)
    with pytest.raises(ValueError):
        fastensor.serialize({"x": {"dtype": "float32", "shape": [3], "data": b"12345678"}})
    with pytest.raises(ValueError):
        fastensor.serialize({"x": {"dtype": "float128", "shape": [1], "data": b"1"}})


# hostile bytes


def _good() -> bytes:
    return st.save({"a": torch.arange(4, dtype=torch.float32), "b": torch.ones(2)})


def _corrupt_cases() -> dict[str, bytes]:
    f32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    return {
        "empty": b"",
        "short": b"\x01\x02\x03",
        "length beyond the data": _raw(b"{}", length=1 << 40),
        "length far beyond the data": b"\xff" * 8 + b"{}",
        "length beyond by one": _raw(b"{}      ", length=9),
        "not json": _raw(b"{not json}"),
        "not utf-8": _raw(b'{"\xff":1}'),
        "json array": _raw([1, 2]),
        "json nan": _raw(b'{"a":NaN}'),
        "deep json": _raw(b"[" * 100000 + b"]" * 100000),
        "duplicate key": _raw(
            b'{"a":' + json.dumps(f32).encode() + b',"a":' + json.dumps(f32).encode() + b"}",
            b"\0" * 8,
        ),
        "entry not object": _raw({"a": 3}, b""),
        "unknown dtype": _raw({"a": {**f32, "dtype": "F128"}}, b"\0" * 8),
        "negative shape": _raw({"a": {**f32, "shape": [-2]}}, b"\0" * 8),
        "float shape": _raw({"a": {**f32, "shape": [2.0]}}, b"\0" * 8),
        "bool shape": _raw({"a": {**f32, "shape": [True, 2]}}, b"\0" * 8),
        "missing offsets": _raw({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8),
        "three offsets": _raw({"a": {**f32, "data_offsets": [0, 4, 8]}}, b"\0" * 8),
        "offsets out of range": _raw({"a": {**f32, "data_offsets": [0, 8]}}, b"\0" * 4),
        "huge offsets": _raw(
            {"a": {**f32, "shape": [1 << 61], "data_offsets": [0, 1 << 63]}}, b"\0" * 8
        ),
        "end before start": _raw({"a": {**f32, "data_offsets": [8, 0]}}, b"\0" * 8),
        "shape mismatch": _raw({"a": {**f32, "shape": [3]}}, b"\0" * 8),
        "huge shape": _raw({"a": {**f32, "shape": [1 << 40] * 40}}, b"\0" * 8),
        "overlap": _raw(
            {
                "a": f32,
                "b": {**f32, "data_offsets": [4, 12]},
                "c": {**f32, "shape": [1], "data_offsets": [12, 16]},
            },
            b"\0" * 16,
        ),
        "gap": _raw({"a": {**f32, "data_offsets": [4, 12]}}, b"\0" * 12),
        "trailing data": _raw({"a": f32}, b"\0" * 12),
        "bad metadata": _raw({"__metadata__": {"k": 1}, "a": f32}, b"\0" * 8),
        "truncated": _good()[:-1],
    }


@pytest.mark.parametrize("case", list(_corrupt_cases()))
def test_corrupt_bytes_raise_corrupt_error(case):
    data = _corrupt_cases()[case]
    for load in (ft.load, fn.load, fastensor.deserialize):
        with pytest.raises(CorruptError) as info:
            load(data)
        assert isinstance(info.value, ValueError)
        assert str(info.value)


def test_corrupt_error_names_the_problem():
    f32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    with pytest.raises(CorruptError, match="beyond"):
        ft.load(_raw(b"{}", length=1 << 40))
    with pytest.raises(CorruptError, match="overlap"):
        ft.load(_raw({"a": f32, "b": {**f32, "data_offsets": [4, 12]}}, b"\0" * 12))
    with pytest.raises(CorruptError, match="does not match"):
        ft.load(_raw({"a": {**f32, "shape": [3]}}, b"\0" * 8))
    with pytest.raises(CorruptError, match="JSON"):
        ft.load(_raw(b"{oops"))


def test_safetensors_rejects_our_corrupt_cases_too():
    """Every case refused here is refused by safetensors (so nothing valid is refused)."""
    for case, data in _corrupt_cases().items():
        if case in ("json nan", "duplicate key", "deep json"):
            continue  # (safetensors' parser differs on these; refusing is the safe side)
        with pytest.raises(Exception):  # noqa: B017 (safetensors raises its own types)
            st.load(data)
        assert case


def test_valid_edge_cases_load():
    assert ft.load(_raw({})) == {}
    assert ft.load(_raw(b"{}  ")) == {}
    # Unknown fields in an entry are ignored, as safetensors ignores them.
    data = _raw({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4], "x": 1}}, b"\0" * 4)
    assert ft.load(data)["a"].shape == () and st.load(data)["a"].shape == ()
    # Offsets in any header order, as long as the data is covered once.
    data = _raw(
        {
            "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]},
            "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
        },
        b"\x01\x02\x03\x04",
    )
    assert ft.load(data)["b"].tolist() == [3, 4]
    assert fn.load(data)["a"].tolist() == [1, 2]


# Every dtype through files; what a save refuses (as safetensors.torch refuses it)


def test_every_dtype_round_trips_through_a_file(tmp_path):
    tensors = {k: v.contiguous() for k, v in _all_dtypes().items()}
    tensors["empty_too"] = torch.zeros(2, 0)  # several zero-sized tensors in one file
    path = tmp_path / "all.safetensors"
    ft.save_file(tensors, path)
    back = ft.load_file(path)
    assert back.keys() == tensors.keys()
    for k, v in tensors.items():
        assert _same(back[k], v), k
    with open(path, "rb") as f:
        header = _header(f.read(1 << 20))
    assert header["t_C64"]["dtype"] == "C64"
    if hasattr(torch, "float4_e2m1fn_x2"):
        # The header holds F4's logical shape: torch's last dimension doubled.
        assert header["t_F4"] == {**header["t_F4"], "dtype": "F4", "shape": [3, 8]}
        assert back["t_F4"].shape == (3, 4)
    # safetensors reads the file, every dtype its torch loader knows.
    known = set(getattr(st, "_TYPES", {}).values())
    theirs = st.load_file(path)
    for k, v in tensors.items():
        if v.dtype in known:
            assert _same(theirs[k], v), k


def test_numpy_complex_and_every_integer_width(tmp_path):
    arrays = {
        str(dt): np.arange(6).astype(dt).reshape(2, 3)
        for dt in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
    }
    arrays["c"] = (np.arange(4) + 1j * np.arange(4)).astype(np.complex64)
    arrays["flag"] = np.array([True, False])
    path = tmp_path / "n.safetensors"
    fn.save_file(arrays, path)
    back = fn.load_file(path)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    assert fn.load(fn.save(arrays))["c"].dtype == np.complex64


def test_save_refuses_what_safetensors_refuses(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(ValueError) as err:
        ft.save_file({"t": torch.eye(2).to_sparse()}, path)
    assert str(err.value).startswith("You are trying to save a sparse tensors: `['t']`")
    with pytest.raises(ValueError) as err:
        ft.save_file({"t": {"some": "thing"}}, path)
    assert str(err.value) == "Key `t` is invalid, expected torch.Tensor but received <class 'dict'>"
    assert isinstance(err.value, TypeError)  # (and the TypeError it always was)
    with pytest.raises(ValueError, match="Expected a dict"):
        ft.save_file("notadict", path)
    with pytest.raises(RuntimeError, match="Cannot copy out of meta tensor"):
        ft.save_file({"m": torch.zeros(2, device="meta")}, path)
    assert not path.exists()


def test_tensors_sharing_memory_are_refused_unless_disjoint(tmp_path):
    path = tmp_path / "x.safetensors"
    a = torch.arange(6.0).reshape(2, 3)
    for other in (a[:1], a[1:], a.t(), a):
        with pytest.raises(RuntimeError, match="share memory") as err:
            ft.save_file({"a": a, "b": other}, path)
        assert isinstance(err.value, fastensor.errors.SharedTensorsError)
    base = torch.zeros(10, 10)
    ft.save_file({"low": base[1:], "high": base[:1]}, path)  # one storage, no byte shared
    assert ft.load_file(path)["low"].shape == (9, 10)
    model = torch.nn.Module()
    model.a = torch.nn.Linear(3, 3)
    model.b = model.a
    with pytest.raises(RuntimeError):
        ft.save_file(model.state_dict(), path)
    ft.save_model(model, path)  # records the tie instead


def test_tensor_spec_checks_its_dtype_and_takes_memory_not_addresses():
    spec = fastensor.TensorSpec(dtype="float32", shape=[2], data=np.ones(2, np.float32))
    assert spec.dtype == "F32" and spec.shape == [2]
    data = fastensor.serialize({"x": spec})
    assert safetensors.deserialize(data)[0][1]["dtype"] == "F32"
    packed = fastensor.TensorSpec(dtype="float4_e2m1fn_x2", shape=[3, 2], data=bytes(6))
    assert packed.dtype == "F4" and packed.shape == [3, 4]
    with pytest.raises(fastensor.SafetensorError):
        fastensor.TensorSpec(dtype="nonsense", shape=[1], data=b"")
    with pytest.raises(TypeError):
        fastensor.TensorSpec(dtype="F32", shape=[1], data_ptr=0, data_len=4)
    with pytest.raises(TypeError):
        fastensor.serialize({"x": {"dtype": "float32", "shape": [1], "data_ptr": 0}})
