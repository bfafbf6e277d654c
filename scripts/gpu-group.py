"""The GPU section of process-group loads (run by scripts/gpu-check.sh): one rank per GPU
(NCCL), ``load_file(..., device="cuda:R", process_group=WORLD)`` each way, bit for bit
against a load by one process, ``get_sharded`` against ``torch.chunk``, and the time until
every rank holds every tensor.

Usage: ``gpu-group.py DIR MIB`` (spawns the ranks itself; on a machine with one GPU the
group has one rank, which checks the NCCL path, not its speed).
"""

from __future__ import annotations

import os
import sys
import time


def rank_main(rank: int, world: int, path: str) -> None:
    import fastensor.torch as ft
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    dev = f"cuda:{rank}"
    want = ft.load_file(path, device=dev)
    for way in ("broadcast", "each", "auto"):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        got = ft.load_file(
            path, device=dev, process_group=dist.group.WORLD, group_read=way
        )
        torch.cuda.synchronize()
        dist.barrier()
        seconds = time.perf_counter() - t0
        for k, v in want.items():
            assert torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), (way, k)
        if rank == 0:
            size = sum(v.numel() * v.element_size() for v in want.values())
            print(
                f"group load ({world} ranks, {way}): {seconds:.3f} s, {size / seconds / 1e9:.2f} GB/s"
            )
    with ft.safe_open(
        path, framework="pt", device=dev, process_group=dist.group.WORLD
    ) as f:
        for k in list(f.keys())[:4]:
            part = f.get_sharded(k, 0)
            chunks = torch.chunk(want[k], world, 0)
            if rank < len(chunks):
                assert torch.equal(part, chunks[rank]), k
    if rank == 0:
        print(
            f"group loads on {world} GPU(s): bit-exact each way; get_sharded = torch.chunk"
        )
    dist.destroy_process_group()


def main() -> None:
    import subprocess

    import torch

    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[2])
        return
    directory, mib = sys.argv[1], int(sys.argv[2])
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        print("group: no CUDA device or no NCCL here: skipped")
        return
    import fastensor.torch as ft

    g = torch.Generator().manual_seed(1)
    n = max(1, mib // 16)
    sd = {f"w{i}": torch.randn(2048, 2048, generator=g) for i in range(n)}
    sd["odd"] = torch.randn(1001, 3, generator=g).half()
    path = os.path.join(directory, "group.safetensors")
    ft.save_file(sd, path)
    world = max(1, min(torch.cuda.device_count(), 4))
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world))
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", "29517")
        procs.append(
            subprocess.Popen([sys.executable, __file__, "--rank", path], env=env)
        )
    codes = [p.wait(timeout=600) for p in procs]
    os.remove(path)
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
