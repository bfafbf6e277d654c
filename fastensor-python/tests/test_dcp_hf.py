"""fastensor.dcp_hf: DCP in the Hugging Face layout on the engine, against torch's own
HuggingFaceStorageWriter/Reader: single-process round trips both ways, then 2 ranks on gloo
(consolidated shards, resharded loads, transformers' from_pretrained; see dcp_hf_worker)."""

from __future__ import annotations

import json
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
pytest.importorskip("torch.distributed.checkpoint.hf_storage")

import torch.multiprocessing as tmp  # noqa: E402
from _dist import free_port  # noqa: E402
from conftest import leftovers  # noqa: E402
from fastensor.dcp_hf import (  # noqa: E402
    HuggingFaceStorageReader,
    HuggingFaceStorageWriter,
    consolidate,
)
from safetensors import safe_open  # noqa: E402
from torch.distributed.checkpoint import hf_storage as torch_hf  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        # DCP warns that no process group is initialized (single-process use).
        warnings.simplefilter("ignore", UserWarning)
        yield


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return {
        "embed.weight": torch.randn(50, 16, generator=g),
        "layers.0.w": torch.randn(16, 48, generator=g).to(torch.bfloat16),
        "layers.0.b": torch.randn(48, generator=g).to(torch.float16),
        "layers.1.w": torch.randn(300, 129, generator=g),
        "big": torch.randn(1 << 19, generator=g),  # 2 MiB
        "scalar": torch.tensor(1.5, dtype=torch.float64),
    }


def zeros(sd):
    return {k: torch.zeros_like(v) for k, v in sd.items()}


def assert_same(got, want):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


MAPPING = {"embed.weight": 1, "layers.0.w": 1, "layers.0.b": 2, "layers.1.w": 2, "big": 3}
MAPPING["scalar"] = 3


@pytest.mark.parametrize("mapping", [None, MAPPING], ids=["one-file", "three-files"])
def test_round_trips_with_torchs_classes(tmp_path, mapping):
    sd = state()
    for label, writer in (
        ("ours", HuggingFaceStorageWriter),
        ("torch", torch_hf.HuggingFaceStorageWriter),
    ):
        dcp.save(
            sd,
            storage_writer=writer(str(tmp_path / label), fqn_to_index_mapping=mapping),
            no_dist=True,
        )
    ours_files = sorted(os.listdir(tmp_path / "ours"))
    assert ours_files == sorted(os.listdir(tmp_path / "torch"))
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    theirs = json.loads((tmp_path / "torch" / "model.safetensors.index.json").read_text())
    assert index == theirs
    for f in ours_files:
        if f.endswith(".safetensors"):
            with (
                safe_open(str(tmp_path / "ours" / f), "pt") as a,
                safe_open(str(tmp_path / "torch" / f), "pt") as b,
            ):
                assert a.metadata() == b.metadata()
                assert set(a.keys()) == set(b.keys())
                for k in a.keys():  # noqa: SIM118
                    assert torch.equal(a.get_tensor(k), b.get_tensor(k))
    for files, reader in (
        ("torch", HuggingFaceStorageReader),
        ("ours", torch_hf.HuggingFaceStorageReader),
        ("ours", HuggingFaceStorageReader),
    ):
        back = zeros(sd)
        dcp.load(back, storage_reader=reader(str(tmp_path / files)), no_dist=True)
        assert_same(back, sd)
    assert leftovers(tmp_path / "ours") == []


def test_partial_and_converting_loads(tmp_path):
    sd = state()
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(str(tmp_path)), no_dist=True)
    back = {"layers.1.w": torch.zeros(300, 129, dtype=torch.float64), "big": torch.zeros(1 << 19)}
    dcp.load(back, storage_reader=HuggingFaceStorageReader(str(tmp_path)), no_dist=True)
    assert torch.equal(back["layers.1.w"], sd["layers.1.w"].double())
    assert torch.equal(back["big"], sd["big"])


def test_consolidate_single_process(tmp_path):
    sd = state()
    writer = HuggingFaceStorageWriter(
        str(tmp_path),
        fqn_to_index_mapping=MAPPING,
        save_distributed=True,
        enable_consolidation=True,
    )
    dcp.save(sd, storage_writer=writer, no_dist=True)
    assert sorted(os.listdir(tmp_path)) == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
        "sharded",
    ]
    back = zeros(sd)
    dcp.load(back, storage_reader=torch_hf.HuggingFaceStorageReader(str(tmp_path)), no_dist=True)
    assert_same(back, sd)
    # consolidate() alone, into one file.
    rank_files = [tmp_path / "sharded" / f for f in os.listdir(tmp_path / "sharded")]
    weight_map = consolidate(rank_files, tmp_path / "one", dict.fromkeys(sd, 1))
    assert set(weight_map.values()) == {"model-00001-of-00001.safetensors"}
    back = zeros(sd)
    dcp.load(back, storage_reader=HuggingFaceStorageReader(str(tmp_path / "one")), no_dist=True)
    assert_same(back, sd)


def test_non_tensor_items_are_refused(tmp_path):
    with pytest.raises(CheckpointException, match="tensors only"):
        dcp.save(
            {"w": torch.ones(2), "step": {"n": 3}},
            storage_writer=HuggingFaceStorageWriter(str(tmp_path)),
            no_dist=True,
        )


def test_reader_of_an_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        HuggingFaceStorageReader(str(tmp_path)).read_metadata()


def test_two_ranks_against_torch_and_transformers(tmp_path):
    pytest.importorskip("transformers")
    import dcp_hf_worker

    world = 2
    ctx = tmp.start_processes(
        dcp_hf_worker.entry,
        args=(str(tmp_path), world, free_port()),
        nprocs=world,
        join=False,
        start_method="forkserver",
    )
    try:
        for _ in range(240):  # 2 minutes at most
            if ctx.join(timeout=0.5):
                break
        else:
            raise AssertionError("the ranks did not finish within 2 minutes")
    except BaseException:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
        logs = "\n".join(
            f"--- rank {r} ---\n{(tmp_path / f'rank{r}.log').read_text()[-4000:]}"
            for r in range(world)
            if (tmp_path / f"rank{r}.log").exists()
        )
        raise AssertionError(f"the 2-rank scenario failed\n{logs}") from None
    out = (tmp_path / "rank0.log").read_text()
    assert "load in from_pretrained" in out, out
