"""One rank of the multi-process scenario of ``test_dcp_hf.py`` (gloo on CPU, 2 ranks).

A tiny Llama's weights as DTensors (matrices sharded on dim 0 or dim 1, vectors
replicated) are saved in the Hugging Face layout by fastensor's
``HuggingFaceStorageWriter`` and by torch's, each with ``save_distributed`` and
``enable_consolidation`` into two files. Then:

* the consolidated files of both writers hold the same tensors, file by file;
* each checkpoint loads through the other side's reader (fastensor's reader reads torch's
  files, torch's reader reads fastensor's), resharded (other placements), bit-exact;
* fastensor's reader loads the rank files in ``sharded/`` (chunks at their offsets);
* on rank 0, the consolidated directory (with the model's config) loads in transformers'
  ``from_pretrained`` and in ``fastensor.transformers.from_pretrained``: the same logits as
  the model saved.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import _dist
import _tiny_models
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fastensor import dcp_hf
from torch.distributed.checkpoint import hf_storage as torch_hf
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh


def tiny_llama():
    return _tiny_models.tiny_llama(intermediate_size=96, vocab_size=300).eval()


def reference() -> dict[str, torch.Tensor]:
    """The tensors saved: the model's own (no tied ones in a Llama of this config)."""
    return {k: v.detach().clone() for k, v in tiny_llama().state_dict().items()}


def placed(full: dict[str, torch.Tensor], mesh, flip: bool) -> dict[str, DTensor]:
    """``full`` as DTensors: matrices sharded on dim 0 or 1 (swapped with ``flip``), vectors
    replicated."""
    out = {}
    for i, (k, v) in enumerate(full.items()):
        placement = Replicate() if v.dim() < 2 else Shard((i + int(flip)) % 2)
        out[k] = distribute_tensor(v, mesh, [placement])
    return out


def full_of(sd: dict[str, DTensor]) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() for k, v in sd.items()}


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert got.keys() == want.keys(), f"{what}: keys differ"
    for k in want:
        assert got[k].dtype == want[k].dtype, f"{what}: {k} dtype"
        assert torch.equal(got[k], want[k]), f"{what}: {k} differs"


def scenario(d: Path, rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,))
    ref = reference()
    names = list(ref)
    mapping = {k: 1 + (i >= len(names) // 2) for i, k in enumerate(names)}
    writers = {
        "ours": dcp_hf.HuggingFaceStorageWriter,
        "torch": torch_hf.HuggingFaceStorageWriter,
    }
    for label, writer in writers.items():
        sd = placed(ref, mesh, flip=False)
        dcp.save(
            sd,
            storage_writer=writer(
                str(d / label),
                fqn_to_index_mapping=mapping,
                save_distributed=True,
                enable_consolidation=True,
            ),
        )
    dist.barrier()
    files = sorted(f for f in os.listdir(d / "ours") if f.endswith(".safetensors"))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    if rank == 0:
        from safetensors.torch import load_file

        for f in files:
            assert_same(load_file(d / "ours" / f), load_file(d / "torch" / f), f)
        assert sorted(os.listdir(d / "ours" / "sharded")) == sorted(
            os.listdir(d / "torch" / "sharded")
        )
    readers = [
        ("torch files, fastensor reader", d / "torch", dcp_hf.HuggingFaceStorageReader),
        ("fastensor files, torch reader", d / "ours", torch_hf.HuggingFaceStorageReader),
        ("fastensor files, fastensor reader", d / "ours", dcp_hf.HuggingFaceStorageReader),
        ("rank files, fastensor reader", d / "ours" / "sharded", dcp_hf.HuggingFaceStorageReader),
        (
            "torch rank files, fastensor reader",
            d / "torch" / "sharded",
            dcp_hf.HuggingFaceStorageReader,
        ),
    ]
    for what, path, reader in readers:
        back = placed({k: torch.zeros_like(v) for k, v in ref.items()}, mesh, flip=True)
        dcp.load(back, storage_reader=reader(str(path)))
        assert_same(full_of(back), ref, what)
        print(f"rank {rank}: {what}: resharded, bit-exact", flush=True)
    if rank == 0:
        import fastensor.transformers as ft
        from transformers import LlamaForCausalLM

        model = tiny_llama()
        model.config.save_pretrained(d / "ours")
        x = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            want = model(x).logits
            for loaded in (
                LlamaForCausalLM.from_pretrained(d / "ours"),
                ft.from_pretrained(LlamaForCausalLM, d / "ours"),
            ):
                assert torch.equal(loaded(x).logits, want), "logits differ"
        print("rank 0: the consolidated files load in from_pretrained", flush=True)


def entry(rank: int, directory: str, world: int, port: int) -> None:
    """A rank's entry (``torch.multiprocessing`` start): its output to a log file."""
    _dist.rank_environment(rank, world, port)
    log = open(Path(directory) / f"rank{rank}.log", "w", buffering=1)  # noqa: SIM115
    sys.stdout = sys.stderr = log
    t0 = time.monotonic()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=90))
    try:
        scenario(Path(directory), rank, world)
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()
        print(f"rank {rank}: done in {time.monotonic() - t0:.1f} s", flush=True)
