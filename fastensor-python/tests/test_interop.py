"""Files written by fastensor load in safetensors and the other way round, byte for byte."""

import fastensor.numpy
import fastensor.torch
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch


def state():
    g = torch.Generator().manual_seed(3)
    return {
        "emb": torch.randn(100, 64, generator=g),
        "half": torch.randn(33, 7, generator=g).half(),
        "bf": torch.randn(5, generator=g).bfloat16(),
        "ids": torch.randint(0, 9, (11,), generator=g),
        "flag": torch.tensor([True, False, True]),
        "big": torch.randn(1 << 19, generator=g),
        "zero_d": torch.tensor(2.5),
    }


def test_ours_load_in_safetensors(tmp_path):
    t = state()
    fastensor.torch.save_file(t, tmp_path / "ours.safetensors", metadata={"format": "pt"})
    back = safetensors.torch.load_file(tmp_path / "ours.safetensors")
    assert list(back) == sorted(t) or set(back) == set(t)
    for k, v in t.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    with safetensors.safe_open(tmp_path / "ours.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_theirs_load_in_fastensor(tmp_path):
    t = state()
    safetensors.torch.save_file(t, tmp_path / "theirs.safetensors", metadata={"a": "b"})
    back = fastensor.torch.load_file(tmp_path / "theirs.safetensors")
    for k, v in t.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    with fastensor.torch.safe_open(tmp_path / "theirs.safetensors", "pt") as f:
        assert f.metadata() == {"a": "b"}


def test_tensor_bytes_match_byte_for_byte(tmp_path):
    t = state()
    fastensor.torch.save_file(t, tmp_path / "ours.safetensors")
    safetensors.torch.save_file(t, tmp_path / "theirs.safetensors")
    with (
        safetensors.safe_open(tmp_path / "ours.safetensors", "pt") as a,
        safetensors.safe_open(tmp_path / "theirs.safetensors", "pt") as b,
    ):
        assert sorted(a.keys()) == sorted(b.keys())
        for k in a.keys():  # noqa: SIM118 (safe_open has no __iter__)
            x, y = a.get_tensor(k), b.get_tensor(k)
            assert (
                x.reshape(-1).view(torch.uint8).tolist() == y.reshape(-1).view(torch.uint8).tolist()
            )


@pytest.mark.parametrize("writer", ["fastensor", "safetensors"])
def test_numpy_interop(tmp_path, writer):
    arrays = {
        "a": np.arange(12, dtype=np.int32).reshape(3, 4),
        "f": np.random.default_rng(0).random((17, 3)),
        "h": np.ones(9, dtype=np.float16),
    }
    path = tmp_path / "np.safetensors"
    if writer == "fastensor":
        fastensor.numpy.save_file(arrays, path)
        back = safetensors.numpy.load_file(path)
    else:
        safetensors.numpy.save_file(arrays, path)
        back = fastensor.numpy.load_file(path)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes()


def test_our_data_section_is_aligned_for_direct_io(tmp_path):
    fastensor.torch.save_file(state(), tmp_path / "ours.safetensors")
    raw = (tmp_path / "ours.safetensors").read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    assert (8 + header_len) % 4096 == 0
