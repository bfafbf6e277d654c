"""fastensor.numpy: the same contract for numpy arrays."""

import numpy as np
import pytest
from fastensor.numpy import load_file, load_selected, safe_open, save_file, save_file_async

DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
    np.float16,
    np.int32,
    np.uint32,
    np.float32,
    np.int64,
    np.uint64,
    np.float64,
]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_numpy_dtype_round_trips(tmp_path, dtype):
    rng = np.random.default_rng(0)
    arrays = {
        "x": (rng.random((6, 7)) * 50).astype(dtype),
        "scalar": np.array(3, dtype=dtype),
        "empty": np.zeros((0, 4), dtype=dtype),
    }
    save_file(arrays, tmp_path / "a.safetensors")
    back = load_file(tmp_path / "a.safetensors")
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert back[k].tobytes() == v.tobytes()


def test_fortran_big_endian_and_sliced_arrays(tmp_path):
    base = np.arange(2 << 20, dtype=np.float32).reshape(1024, -1)
    arrays = {
        "fortran": np.asfortranarray(base[:64, :32]),
        "big_endian": base[0].astype(">f4"),
        "sliced": base[::7, 3::5],
    }
    save_file(arrays, tmp_path / "a.safetensors")
    back = load_file(tmp_path / "a.safetensors")
    for k, v in arrays.items():
        np.testing.assert_array_equal(back[k], v)
    assert back["big_endian"].dtype == np.dtype("<f4")


def test_large_arrays_and_selected_reads(tmp_path):
    arrays = {"pad": np.arange(5, dtype=np.uint8), "big": np.random.default_rng(1).random(1 << 19)}
    save_file(arrays, tmp_path / "a.safetensors", metadata={"m": "1"})
    back = load_file(tmp_path / "a.safetensors")
    np.testing.assert_array_equal(back["big"], arrays["big"])
    assert back["big"].flags.writeable and back["big"].flags.c_contiguous
    only = load_selected(tmp_path / "a.safetensors", ["big"])
    assert list(only) == ["big"]
    with safe_open(tmp_path / "a.safetensors", framework="np") as f:
        assert f.keys() == ["big", "pad"] and f.metadata() == {"m": "1"}  # sorted
        assert f.offset_keys() == ["pad", "big"]  # in file order
        np.testing.assert_array_equal(f.get_tensor("pad"), arrays["pad"])


def test_async_numpy_save(tmp_path):
    a = {"w": np.ones(1 << 16, dtype=np.float32)}
    h = save_file_async(a, tmp_path / "a.safetensors")
    a["w"][:] = 0
    h.wait()
    np.testing.assert_array_equal(load_file(tmp_path / "a.safetensors")["w"], 1)


def test_numpy_refuses_what_it_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="complex"):
        save_file({"c": np.zeros(2, dtype=np.complex128)}, tmp_path / "c.safetensors")
    with pytest.raises(ValueError, match="object"):
        save_file({"o": np.array([object()])}, tmp_path / "o.safetensors")
    with pytest.raises(TypeError):
        save_file({"l": [1, 2]}, tmp_path / "l.safetensors")
    torch = pytest.importorskip("torch")
    from fastensor.torch import save_file as save_pt

    save_pt({"b": torch.ones(2, dtype=torch.bfloat16)}, tmp_path / "bf.safetensors")
    with pytest.raises(ValueError, match="`b`.*BF16"):
        load_file(tmp_path / "bf.safetensors")


def test_top_level_safe_open_dispatches_on_framework(tmp_path):
    import fastensor

    save_file({"a": np.arange(4, dtype=np.int16)}, tmp_path / "a.safetensors")
    with fastensor.safe_open(tmp_path / "a.safetensors", framework="np") as f:
        np.testing.assert_array_equal(f.get_tensor("a"), np.arange(4, dtype=np.int16))
    with pytest.raises(ValueError, match="framework"):
        fastensor.safe_open(tmp_path / "a.safetensors", framework="tf")
