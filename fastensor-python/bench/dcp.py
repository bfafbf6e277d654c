"""Benchmark: torch.distributed.checkpoint's own FileSystemWriter/Reader against
fastensor.dcp.Writer/Reader, async save's blocking time, and HF sharded save/load against
safetensors file by file, in one run with the rounds' phases shuffled.

    python bench/dcp.py [--dir DIR] [--rounds 3] [--gb 1.4] [--ranks 2] [--warmup 1]

``--ranks`` processes (gloo, CPU) hold a state dict of ``--gb`` GB of float32 DTensors
sharded on dim 0 (96 matrices) plus replicated biases. Per round, in a shuffled order:

* ``dcp.save`` with ``FileSystemWriter`` (thread_count 1, the default, and 4) and with
  ``fastensor.dcp.Writer``; each followed by a cold ``dcp.load`` (page cache dropped for the
  files with ``posix_fadvise(DONTNEED)``) with the matching reader, into the same state;
* ``dcp.async_save``: the time until it returns (blocking) and until its future is done,
  with ``FileSystemWriter`` and with ``Writer(cache_staged_state_dict=True)``;
* on rank 0 alone, the HF layout of its local tensors: ``save_sharded`` against
  ``safetensors.torch.save_file`` shard by shard (each file fsynced), and a cold
  ``load_sharded`` against ``safetensors.torch.load_file`` shard by shard, both timed until
  one byte of every page of every tensor has been read (safetensors maps files lazily).

First, ``--warmup`` untimed rounds of the fastensor phases let the engine's selector
explore its backends (its profile is off here, ``FASTENSOR_PROFILE=""``; in normal use the
profile keeps what it learned between runs), and allocate the cached staging copy of the
async writer. Times are the slowest rank's. The table gives every round's time, the median,
and the median of the per-round ratios (torch's time over fastensor's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import _util
from _util import drop_file_cache, files_under, touch

ROWS, COLS = 2048, 1792  # per full matrix (float32): 14.7 MB


def worker(rank: int, world: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), FASTENSOR_PROFILE="")
    import fastensor.dcp as fdcp
    import fastensor.torch as ft
    import safetensors.torch as st
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor, Shard, init_device_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=1800))
    # async_save's collectives run on a thread of their own while this one times the next
    # step with collectives of its own: they get a process group of their own (as torch
    # advises), or the two threads' collectives can meet out of order and wait forever.
    async_group = dist.new_group(backend="gloo")
    mesh = init_device_mesh("cpu", (world,))
    base = Path(args.dir)
    n = max(1, round(args.gb * 1e9 / (ROWS * COLS * 4)))
    g = torch.Generator().manual_seed(rank)
    local_rows = ROWS // world
    sd = {}
    for i in range(n):
        local = torch.randn(local_rows, COLS, generator=g)
        sd[f"layers.{i}.weight"] = DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=(ROWS, COLS), stride=(COLS, 1)
        )
        sd[f"layers.{i}.bias"] = torch.full((COLS,), float(i))
    total = n * ROWS * COLS * 4 + n * COLS * 4
    local_sd = {k: (v.to_local() if isinstance(v, DTensor) else v) for k, v in sd.items()}
    local_bytes = sum(v.numel() * v.element_size() for v in local_sd.values())

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        return float(dt.item())

    def cold(path: Path) -> None:
        dist.barrier()
        if rank == 0:
            drop_file_cache(files_under(path))
        dist.barrier()

    results: dict[str, list[float]] = {}

    def record(name: str, t: float) -> None:
        results.setdefault(name, []).append(t)

    def dcp_phase(label: str, make_writer, make_reader) -> None:
        path = base / label
        shutil.rmtree(path, ignore_errors=True) if rank == 0 else None
        dist.barrier()
        record(f"{label} save", timed(lambda: dcp.save(sd, storage_writer=make_writer(path))))
        cold(path)
        record(f"{label} load", timed(lambda: dcp.load(sd, storage_reader=make_reader(path))))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)

    fast_async_writer = {}

    def async_phase(label: str, make_writer) -> None:
        path = base / f"async-{label}"
        shutil.rmtree(path, ignore_errors=True) if rank == 0 else None
        dist.barrier()
        box = {}

        def start() -> None:
            writer = make_writer(path)
            box["f"] = dcp.async_save(sd, storage_writer=writer, process_group=async_group)

        record(f"async {label} blocking", timed(start))
        t0 = time.perf_counter()
        box["f"].result()
        done = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        record(f"async {label} rest", float(done.item()))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)

    def fast_cached_writer(path: Path):
        w = fast_async_writer.get("w")
        if w is None:
            w = fast_async_writer["w"] = fdcp.Writer(path, cache_staged_state_dict=True)
        w.reset(path)
        return w

    shard_bytes = 200 * 10**6

    def hf_phase(label: str) -> None:
        path = base / f"hf-{label}"
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
        if label == "fastensor":

            def save() -> None:
                if rank == 0:
                    ft.save_sharded(local_sd, path, max_shard_size=shard_bytes)

            def load() -> None:
                if rank == 0:
                    touch(ft.load_sharded(path).values())
        else:

            def save() -> None:
                if rank != 0:
                    return
                shards, cur, size = [], {}, 0
                for k, v in local_sd.items():
                    b = v.numel() * v.element_size()
                    if cur and size + b > shard_bytes:
                        shards.append(cur)
                        cur, size = {}, 0
                    cur[k] = v
                    size += b
                shards.append(cur)
                wm = {}
                for i, part in enumerate(shards):
                    name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                    st.save_file(part, str(path / name), metadata={"format": "pt"})
                    fd = os.open(path / name, os.O_RDONLY)
                    os.fsync(fd)
                    os.close(fd)
                    wm.update({k: name for k in part})
                (path / "model.safetensors.index.json").write_text(
                    json.dumps({"metadata": {"total_size": local_bytes}, "weight_map": wm})
                )

            def load() -> None:
                if rank != 0:
                    return
                index = json.loads((path / "model.safetensors.index.json").read_text())
                out = {}
                for name in sorted(set(index["weight_map"].values())):
                    out.update(st.load_file(str(path / name)))
                touch(out.values())

        record(f"hf {label} save", timed(save))
        cold(path)
        record(f"hf {label} load", timed(load))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)

    phases = {
        "torch-t1": lambda: dcp_phase(
            "torch-t1",
            lambda p: dcp.FileSystemWriter(str(p)),
            lambda p: dcp.FileSystemReader(str(p)),
        ),
        "torch-t4": lambda: dcp_phase(
            "torch-t4",
            lambda p: dcp.FileSystemWriter(str(p), thread_count=4),
            lambda p: dcp.FileSystemReader(str(p)),
        ),
        "fastensor": lambda: dcp_phase("fastensor", fdcp.Writer, fdcp.Reader),
        "async-torch": lambda: async_phase("torch", lambda p: dcp.FileSystemWriter(str(p))),
        "async-fastensor": lambda: async_phase("fastensor", fast_cached_writer),
        "hf-fastensor": lambda: hf_phase("fastensor"),
        "hf-safetensors": lambda: hf_phase("safetensors"),
    }
    # Untimed: the fastensor phases once, so that the engine's selector has explored its
    # backends (with a profile, FASTENSOR_PROFILE, that carries over between runs; here it
    # is off, so every run would explore anew inside the timed rounds).
    for _ in range(args.warmup):
        for name in ("fastensor", "hf-fastensor", "async-fastensor"):
            phases[name]()
    results.clear()
    for r, order in _util.interleaved(phases, args.rounds, args.seed):
        if rank == 0:
            print(f"round {r + 1}: {', '.join(order)}", flush=True)
        for name in order:
            phases[name]()
    if rank == 0:
        report(results, total, local_bytes, n, world, args)
    dist.barrier()
    dist.destroy_process_group()


def report(results, total, local_bytes, n, world, args) -> None:
    def row(name: str, nbytes: int) -> str:
        ts = results[name]
        med = statistics.median(ts)
        rounds = " / ".join(f"{t:.2f}" for t in ts)
        return f"| {name} | {rounds} | {med:.2f} | {nbytes / med / 1e9:.2f} |"

    print()
    print(
        f"state dict: {total / 1e9:.2f} GB ({n} float32 DTensors of {ROWS}x{COLS} sharded on"
        f" dim 0 over {world} ranks, {n} replicated biases); HF phases: rank 0's"
        f" {local_bytes / 1e9:.2f} GB in shards of 200 MB; {args.rounds} rounds, shuffled"
    )
    print()
    print("| phase | seconds per round | median s | GB/s |")
    print("|---|---|---|---|")
    for name in results:
        nbytes = local_bytes if name.startswith("hf") else total
        print(row(name, nbytes))
    print()
    print("| ratio (torch or safetensors time / fastensor time) | per round | median |")
    print("|---|---|---|")
    pairs = [
        ("DCP save vs FileSystemWriter t1", "torch-t1 save", "fastensor save"),
        ("DCP save vs FileSystemWriter t4", "torch-t4 save", "fastensor save"),
        ("DCP load vs FileSystemReader (t1 files)", "torch-t1 load", "fastensor load"),
        ("DCP load vs FileSystemReader (t4 files)", "torch-t4 load", "fastensor load"),
        ("async_save blocking", "async torch blocking", "async fastensor blocking"),
        ("HF sharded save vs safetensors per shard", "hf safetensors save", "hf fastensor save"),
        ("HF sharded load vs safetensors per shard", "hf safetensors load", "hf fastensor load"),
    ]
    for label, a, b in pairs:
        if a in results and b in results:
            rs = [x / y for x, y in zip(results[a], results[b], strict=False) if y > 0]
            per = " / ".join(f"{x:.2f}" for x in rs)
            med = statistics.median(rs) if rs else math.nan
            print(f"| {label} | {per} | {med:.2f}x |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default="/tmp/fastensor-dcp-bench")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gb", type=float, default=1.4)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds of the fastensor phases first"
    )
    args = p.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=worker, args=(r, args.ranks, args, port)) for r in range(args.ranks)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    sys.exit(max(abs(proc.exitcode or 0) for proc in procs))


if __name__ == "__main__":
    main()
