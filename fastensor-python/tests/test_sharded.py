"""Sharded checkpoints in the Hugging Face layout: fastensor.torch.save_sharded,
load_sharded, load_into(module, directory | index), and interop with safetensors."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import fastensor.torch as ft  # noqa: E402
from fastensor._sharded import parse_size  # noqa: E402

INDEX = "model.safetensors.index.json"


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.LayerNorm(512), torch.nn.Linear(512, 128)
    )


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "embed.weight": torch.randn(1000, 64, generator=g),
        "layers.0.weight": torch.randn(256, 256, generator=g).to(torch.bfloat16),
        "layers.0.bias": torch.randn(256, generator=g),
        "layers.1.weight": torch.randn(300, 200, generator=g),
        "layers.1.idx": torch.arange(77, dtype=torch.int64),
        "head.weight": torch.randn(128, 64, generator=g).t(),  # non-contiguous
        "scalar": torch.tensor(1.5),
    }


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("500MiB") == 500 << 20
    assert parse_size("1.5kb") == 1500
    assert parse_size(123) == 123
    for bad in ("lots", "-1GB", 0, "0MB"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_save_sharded_writes_the_hf_layout_that_safetensors_reads(tmp_path):
    t = _tensors()
    weight_map = ft.save_sharded(t, tmp_path, max_shard_size=200_000)
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["weight_map"] == weight_map
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in t.values())
    shards = sorted(set(weight_map.values()))
    n = len(shards)
    assert n >= 3
    assert shards == [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    assert sorted(f for f in os.listdir(tmp_path) if not f.startswith(".")) == sorted(
        [*shards, INDEX]
    )
    # File by file with safetensors, as transformers loads them.
    seen = {}
    for shard in shards:
        with st.safe_open(str(tmp_path / shard), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
        part = st.load_file(str(tmp_path / shard))
        for k in part:
            assert weight_map[k] == shard
        seen.update(part)
    assert seen.keys() == t.keys()
    for k, v in t.items():
        assert torch.equal(seen[k], v), k


def test_load_sharded_bit_exact_by_directory_or_index(tmp_path):
    t = _tensors()
    ft.save_sharded(t, tmp_path, max_shard_size="150KB")
    for path in (tmp_path, tmp_path / INDEX, str(tmp_path)):
        back = ft.load_sharded(path)
        assert back.keys() == t.keys()
        for k, v in t.items():
            assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    some = ft.load_sharded(tmp_path, names=["layers.1.idx", "embed.weight"])
    assert list(some) == ["layers.1.idx", "embed.weight"]
    assert torch.equal(some["embed.weight"], t["embed.weight"])
    with pytest.raises(FileNotFoundError):
        ft.load_sharded(tmp_path, names=["nope"])


def test_shards_written_by_safetensors_in_the_hf_layout_load(tmp_path):
    t = {k: v.contiguous() for k, v in _tensors().items()}
    names = list(t)
    parts = [names[:3], names[3:5], names[5:]]
    weight_map = {}
    for i, part in enumerate(parts):
        shard = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        st.save_file({k: t[k] for k in part}, str(tmp_path / shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in part})
    (tmp_path / INDEX).write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    back = ft.load_sharded(tmp_path)
    for k, v in t.items():
        assert torch.equal(back[k], v), k
    f = ft.open_sharded(tmp_path)
    assert f.weight_map == weight_map
    assert len(f.shards) == 3


def test_load_into_a_module_from_a_directory_or_an_index(tmp_path):
    src = _model()
    ft.save_sharded(src.state_dict(), tmp_path, max_shard_size=300_000)
    for path in (tmp_path, tmp_path / INDEX):
        dst = torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.LayerNorm(512), torch.nn.Linear(512, 128)
        )
        ptr = dst[0].weight.data_ptr()
        res = ft.load_into(dst, path)
        assert res.missing_keys == [] and res.unexpected_keys == []
        assert dst[0].weight.data_ptr() == ptr  # filled in place
        for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values(), strict=False):
            assert torch.equal(a, b), k


def test_load_into_reports_missing_and_unexpected_across_shards(tmp_path):
    src = _model()
    sd = dict(src.state_dict())
    sd["extra"] = torch.ones(3)
    del sd["2.bias"]
    ft.save_sharded(sd, tmp_path, max_shard_size=300_000)
    dst = _model()
    with torch.no_grad():
        for p in dst.parameters():
            p.zero_()
    with pytest.raises(RuntimeError, match="Missing key"):
        ft.load_into(dst, tmp_path)
    res = ft.load_into(dst, tmp_path, strict=False)
    assert res.missing_keys == ["2.bias"] and res.unexpected_keys == ["extra"]
    assert torch.equal(dst[0].weight, src[0].weight)


def test_a_second_save_replaces_the_shards(tmp_path):
    t = _tensors()
    ft.save_sharded(t, tmp_path, max_shard_size=100_000)
    ft.save_sharded({"only": torch.ones(10)}, tmp_path)
    files = sorted(f for f in os.listdir(tmp_path) if not f.startswith("."))
    assert files == sorted(["model-00001-of-00001.safetensors", INDEX])
    assert list(ft.load_sharded(tmp_path)) == ["only"]


def test_a_missing_index_or_shard_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        ft.load_sharded(tmp_path)
    ft.save_sharded(_tensors(), tmp_path, max_shard_size=100_000)
    os.unlink(tmp_path / "model-00002-of-00005.safetensors")
    with pytest.raises(FileNotFoundError):
        ft.load_sharded(tmp_path)
