"""One rank of a multi-process DCP scenario (run by ``_dist.run_world``; gloo on CPU).

Usage: ``dcp_worker.py SCENARIO DIRECTORY`` with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` set.

* ``save`` (4 ranks): saves a model, its Adam state, DTensors sharded on dim 0 and dim 1
  (uneven), plain tensors of several dtypes and Python objects with ``fastensor.dcp.Writer``;
  then a save to the same directory in which rank 2 fails halfway (the old checkpoint must
  stay the one that loads, bit-exact); then an ``async_save`` while training goes on (the
  checkpoint must hold the state at the call). Rank 0 keeps the full reference values.
* ``load2`` (2 ranks), ``load1`` (1 rank): load both checkpoints resharded (DTensors on 2
  ranks, some on another dim; plain tensors on 1) and compare them bit for bit.
* ``local`` (2 ranks): a coordinated save, then saves without rank coordination
  (``use_collectives=False``) of states that differ by rank, into the same directory; each
  rank loads back its own state, bit-exact, and the coordinated checkpoint is gone.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import _dist
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fastensor.dcp import METADATA_NAME, Reader, Writer
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh


def make_model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 32, generator=g)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def full_values() -> dict[str, torch.Tensor]:
    """The sharded tensors' full values (the same on every rank)."""
    g = torch.Generator().manual_seed(7)
    return {
        "w0": torch.randn(64, 33, generator=g),
        "w1": torch.randn(12, 40, generator=g).to(torch.bfloat16),
        "e": torch.arange(30, dtype=torch.int64).reshape(10, 3),
    }


PLACEMENT_SAVE = {"w0": Shard(0), "w1": Shard(1), "e": Shard(0)}
PLACEMENT_LOAD = {"w0": Shard(0), "w1": Shard(0), "e": Shard(1)}


def make_state(model, opt, mesh, placements, fill: bool) -> dict:
    model_sd, optim_sd = get_state_dict(model, opt)
    full = full_values()
    if not fill:
        full = {k: torch.zeros_like(v) for k, v in full.items()}
    if mesh is None:
        sharded = full
    else:
        sharded = {k: distribute_tensor(v, mesh, [placements[k]]) for k, v in full.items()}
    g = torch.Generator().manual_seed(11)
    plain = {
        "i8": torch.randint(-100, 100, (5, 7), dtype=torch.int8, generator=g),
        "f16_t": torch.randn(16, 8, generator=g).to(torch.float16).t(),  # non-contiguous
        "mask": torch.rand(9, generator=g) > 0.5,
        "scalar": torch.tensor(3.25, dtype=torch.float64),
    }
    if not fill:
        plain = {k: torch.zeros_like(v) for k, v in plain.items()}
    extra = {"tag": "v1", "lst": [1, 2, 3]} if fill else {"tag": "", "lst": []}
    return {
        "model": model_sd,
        "optim": optim_sd,
        "sharded": sharded,
        "plain": plain,
        "extra": extra,
    }


def to_full(obj):
    if isinstance(obj, DTensor):
        return obj.full_tensor()
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: to_full(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_full(v) for v in obj]
    return obj


def assert_same(got, want, path: str = "") -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got)}"
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{path}: shape {got.shape} != {want.shape}"
        a = got.detach().contiguous().reshape(-1).view(torch.uint8)
        b = want.detach().contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(a, b), f"{path}: values differ"
    elif isinstance(want, dict):
        assert set(got) == set(want), f"{path}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{path}: {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


class FailingWriter(Writer):
    """Rank ``fail_rank`` writes half its items, then fails."""

    def __init__(self, path, fail_rank: int) -> None:
        super().__init__(path)
        self.fail_rank = fail_rank

    def write_data(self, plan, planner):
        if dist.get_rank() == self.fail_rank:
            half = type(plan)(
                items=plan.items[: len(plan.items) // 2], storage_data=plan.storage_data
            )
            super().write_data(half, planner).wait()
            raise RuntimeError("injected failure halfway through this rank's save")
        return super().write_data(plan, planner)


def bump(sd) -> None:
    """Changes every floating tensor of ``sd`` in place."""
    with torch.no_grad():
        for v in sd.values():
            if isinstance(v, dict):
                bump(v)
            elif isinstance(v, DTensor):
                if v.dtype.is_floating_point:
                    v.to_local().add_(1)
            elif isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
                v.add_(1)


def trained_state(world: int):
    """The mesh, a model and its optimizer after one step, and their full state to save."""
    mesh = init_device_mesh("cpu", (world,))
    model, opt = make_model(0)
    train_step(model, opt, 1)
    return mesh, model, opt, make_state(model, opt, mesh, PLACEMENT_SAVE, fill=True)


def scenario_save(d: Path, rank: int, world: int) -> None:
    mesh, model, opt, sd = trained_state(world)
    dcp.save(sd, storage_writer=Writer(d / "ckpt"))
    ref = to_full(sd)
    if rank == 0:
        torch.save(ref, d / "ref.pt")
        meta_before = (d / "ckpt" / METADATA_NAME).read_bytes()

    # A rank fails halfway: no metadata is written, the old checkpoint stays.
    bump(sd)
    try:
        dcp.save(sd, storage_writer=FailingWriter(d / "ckpt", fail_rank=2))
    except CheckpointException as exc:  # raised on every rank (a BaseException)
        print(f"rank {rank}: the failing save raised {type(exc).__name__}")
    else:
        raise AssertionError("a save with a failing rank did not raise")
    dist.barrier()
    if rank == 0:
        assert (d / "ckpt" / METADATA_NAME).read_bytes() == meta_before, "metadata changed"
    back = make_state(*make_model(5), mesh, PLACEMENT_SAVE, fill=False)
    dcp.load(back, storage_reader=Reader(d / "ckpt"))
    assert_same(to_full(back), ref)

    # async_save: the checkpoint holds the state at the call, training goes on meanwhile.
    at_call = to_full(sd)
    future = dcp.async_save(sd, storage_writer=Writer(d / "async"))
    before = [p.detach().clone() for p in model.parameters()]
    for step in range(3):
        train_step(model, opt, 100 + step)
    moved = any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=False))
    assert moved, "training did not change the parameters"
    future.result(timeout=60)
    if rank == 0:
        torch.save(at_call, d / "async_ref.pt")
    back = make_state(*make_model(6), mesh, PLACEMENT_SAVE, fill=False)
    dcp.load(back, storage_reader=Reader(d / "async"))
    assert_same(to_full(back), at_call)


def scenario_load(d: Path, rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,)) if world > 1 else None
    for name, ref_name in (("ckpt", "ref.pt"), ("async", "async_ref.pt")):
        ref = torch.load(d / ref_name, weights_only=False)
        back = make_state(*make_model(9), mesh, PLACEMENT_LOAD, fill=False)
        dcp.load(back, storage_reader=Reader(d / name))
        assert_same(to_full(back), ref, name)
        print(f"rank {rank}: {name} loaded on {world} ranks, bit-exact")


def scenario_local(d: Path, rank: int, world: int) -> None:
    mesh, model, opt, sd = trained_state(world)
    dcp.save(sd, storage_writer=Writer(d / "local"))
    dist.barrier()
    # Each rank alone: its own training state, different from the other rank's.
    train_step(model, opt, 10 + rank)
    sd = make_state(model, opt, mesh, PLACEMENT_SAVE, fill=True)
    sd["plain"]["mine"] = torch.full((3,), float(rank))
    dcp.save(sd, storage_writer=Writer(d / "local"), use_collectives=False)
    want = to_full({k: v for k, v in sd.items() if k != "sharded"})
    want_local = {k: v.to_local().clone() for k, v in sd["sharded"].items()}
    dist.barrier()
    names = sorted(os.listdir(d / "local"))
    assert METADATA_NAME not in names, names
    assert f"{METADATA_NAME}.rank{rank}" in names, names
    assert sum(n.endswith(".safetensors") for n in names) == world, names
    back = make_state(*make_model(5), mesh, PLACEMENT_SAVE, fill=False)
    back["plain"]["mine"] = torch.zeros(3)
    dcp.load(back, storage_reader=Reader(d / "local"))
    assert_same(to_full({k: v for k, v in back.items() if k != "sharded"}), want)
    assert_same({k: v.to_local() for k, v in back["sharded"].items()}, want_local)
    print(f"rank {rank}: its own state back, bit-exact")


def scenario_s3(d: Path, rank: int, world: int) -> None:
    """Saves and loads through an object prefix; ``d / "s3.json"`` names the server and the
    checkpoint id."""
    import json

    where = json.loads((d / "s3.json").read_text())
    os.environ.update(where["env"])
    ckpt = where["url"]
    mesh, model, opt, sd = trained_state(world)
    dcp.save(sd, storage_writer=Writer(ckpt))
    back = make_state(*make_model(5), mesh, PLACEMENT_SAVE, fill=False)
    dcp.load(back, storage_reader=Reader(ckpt))
    assert_same(to_full(back), to_full(sd))
    # A second save supersedes the first: its data objects are deleted after the metadata.
    bump(sd)
    dcp.save(sd, storage_writer=Writer(ckpt))
    back = make_state(*make_model(6), mesh, PLACEMENT_SAVE, fill=False)
    dcp.load(back, storage_reader=Reader(ckpt))
    assert_same(to_full(back), to_full(sd))
    print(f"rank {rank}: saved to and loaded from {ckpt}, bit-exact")


def run(scenario: str, directory: Path, rank: int, world: int) -> None:
    """Runs ``scenario`` as rank ``rank`` of ``world`` (``MASTER_ADDR``/``MASTER_PORT`` set)."""
    t0 = time.monotonic()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        if scenario == "save":
            scenario_save(directory, rank, world)
        elif scenario in ("load2", "load1"):
            scenario_load(directory, rank, world)
        elif scenario == "local":
            scenario_local(directory, rank, world)
        elif scenario == "s3":
            scenario_s3(directory, rank, world)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print(f"rank {rank}: ok in {time.monotonic() - t0:.1f} s", flush=True)


def entry(scenario: str, directory: str, rank: int, world: int, port: int, log: str) -> None:
    """A forked rank's entry (see ``_dist.logged_entry``)."""
    _dist.logged_entry(run, scenario, directory, rank, world, port, log)


if __name__ == "__main__":
    run(sys.argv[1], Path(sys.argv[2]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
