"""The offload section of scripts/gpu-check.sh: activation offload from GPU memory.

    python3 scripts/gpu-offload.py DIR [--rounds N] [--layers L] [--d D] [--seq S]

On a GPU (PyTorch with CUDA): a stack of ``torch.nn.TransformerEncoderLayer`` (pre-norm)
trained with SGD, each configuration in a fresh process, the rounds interleaved: no
offload, activation checkpointing, ``torch.autograd.graph.save_on_cpu(pin_memory=True)``,
and ``fastensor.torch.offload`` on the staged and the direct path. Per configuration: the
median step time at a batch no offload fits (and its ratio to no offload's), the peak GPU
memory there, and the largest batch within a GPU memory cap (``--cap-gib``, set with
``torch.cuda.set_per_process_memory_fraction``), found by doubling then bisecting.

Without a GPU for PyTorch (the CUDA stand-in, which PyTorch cannot use), it runs the same
GPU path of the offload store through fastensor's own CUDA memory (``DeviceArray``): round
trips on both paths, bit-exact. That checks this script and the bundle, not speed.

Prints one table (or the logic check's line); exits 1 when bytes come back wrong or a
configuration fails for another reason than running out of memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = ["none", "checkpoint", "save_on_cpu", "fastensor-staged", "fastensor-direct"]


def worker(spec: dict) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    dev = torch.device("cuda")
    if spec.get("cap_gib"):
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, spec["cap_gib"] * 2**30 / total)
        )
    layers = nn.ModuleList(
        nn.TransformerEncoderLayer(
            spec["d"], spec["d"] // 64, batch_first=True, norm_first=True
        )
        for _ in range(spec["layers"])
    ).to(dev)
    opt = torch.optim.SGD(layers.parameters(), lr=1e-3)
    x = torch.randn(
        spec["batch"], spec["seq"], spec["d"], device=dev, requires_grad=True
    )
    config = spec["config"]

    def forward(h):
        for layer in layers:
            if config == "checkpoint":
                from torch.utils.checkpoint import checkpoint

                h = checkpoint(layer, h, use_reentrant=False)
            else:
                h = layer(h)
        return h

    def hooks():
        import contextlib

        if config == "save_on_cpu":
            return torch.autograd.graph.save_on_cpu(pin_memory=True)
        if config.startswith("fastensor"):
            from fastensor.torch import offload

            path = config.split("-", 1)[1]
            return offload(
                dir=spec["dir"], budget_bytes=spec["budget"], device_path=path
            )
        return contextlib.nullcontext()

    times = []
    try:
        for _ in range(spec["steps"]):
            torch.cuda.synchronize()  # the measurement's, not the configuration's
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            with hooks():
                loss = forward(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)
            del loss
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    except torch.OutOfMemoryError:
        print(json.dumps({"ok": False, "why": "out of memory"}))
        return
    print(
        json.dumps(
            {
                "ok": True,
                "time": statistics.median(times[1:] or times),
                "peak": torch.cuda.max_memory_allocated(),
            }
        )
    )


def run(spec: dict) -> dict:
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"ok": False, "why": f"exit {p.returncode}: {tail[:160]}"}
    return json.loads(lines[-1])


def largest(spec: dict, start: int) -> int:
    lo, hi, b = 0, None, start
    while hi is None and b <= 4096:
        if run({**spec, "batch": b, "steps": 2})["ok"]:
            lo, b = b, b * 2
        else:
            hi = b
    while hi is not None and hi - lo > max(1, lo // 8):
        mid = (lo + hi) // 2
        if run({**spec, "batch": mid, "steps": 2})["ok"]:
            lo = mid
        else:
            hi = mid
    return lo


def on_gpu(args) -> int:
    import torch

    name = torch.cuda.get_device_name(0)
    base = {
        "layers": args.layers,
        "d": args.d,
        "seq": args.seq,
        "dir": args.dir,
        "steps": args.steps,
        "cap_gib": args.cap_gib,
    }
    # A layer's saved activations at one sequence, roughly (bytes): the budget keeps about
    # one layer's worth on the GPU and in pinned memory.
    per_layer = 34 * args.seq * args.d * 4
    results: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        order = CONFIGS if r % 2 == 0 else list(reversed(CONFIGS))
        for c in order:
            budget = per_layer * args.batch
            results[c].append(
                run({**base, "config": c, "batch": args.batch, "budget": budget})
            )
    failed = 0
    print(
        f"offload on {name}: {args.layers} layers, d_model {args.d}, {args.seq} tokens, "
        f"batch {args.batch}, {args.rounds} interleaved rounds; cap {args.cap_gib} GiB for the "
        "largest batch"
    )
    print(
        "| configuration | step ms | vs no offload | peak GiB | largest batch | vs no offload |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    none_t = [r["time"] for r in results["none"] if r.get("ok")]
    none_b = None
    for c in CONFIGS:
        ok = [r for r in results[c] if r.get("ok")]
        if not ok:
            why = results[c][0].get("why", "?")
            print(f"| {c} | {why} | - | - | - | - |")
            failed |= "out of memory" not in why
            continue
        t = statistics.median(r["time"] for r in ok)
        peak = max(r["peak"] for r in ok) / 2**30
        ratios = [r["time"] / n for r, n in zip(ok, none_t, strict=False)]
        budget = per_layer * args.batch
        big = largest({**base, "config": c, "budget": budget}, max(1, args.batch // 2))
        if c == "none":
            none_b = big
        vs = f"{big / none_b:.1f}x" if none_b else "-"
        print(
            f"| {c} | {t * 1e3:.1f} | {statistics.median(ratios):.2f}x | {peak:.2f} | {big} | {vs} |"
        )
    return failed


def logic_check(folder: str) -> int:
    import random

    from fastensor import _native
    from fastensor._engine import engine_or_default

    try:
        _native.DeviceArray.zeros(1, 0)
    except Exception as e:  # noqa: BLE001 (any reason CUDA cannot run)
        print(f"offload (GPU path): not checked: no CUDA here ({e})")
        return 0
    rng = random.Random(1)
    sizes = [1, 4097, 1 << 20, (3 << 20) + 5]
    for path in ("staged", "direct"):
        store = _native.OffloadStore(
            engine_or_default(None), folder, 2 << 20, device_path=path
        )
        data = [rng.randbytes(n) for n in sizes]
        hs = [
            store.put_device(_native.DeviceArray.from_bytes(b, 0), f"t{i}")
            for i, b in enumerate(data)
        ]
        for i in reversed(range(len(sizes))):
            out = _native.DeviceArray.zeros(sizes[i], 0)
            store.get_into(hs[i], out)
            if out.to_bytes() != data[i]:
                print(f"offload (GPU path, {path}): tensor {i} came back wrong")
                return 1
        store.close()
    print(
        "offload (GPU path): staged and direct round trips bit-exact (logic only: no GPU speed)"
    )
    return 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cap-gib", type=float, default=16.0)
    args = ap.parse_args()
    from fastensor import _native

    stand_in = any("stand-in" in str(b[2] or "") for b in _native.backends())
    try:
        import torch

        gpu = not stand_in and torch.cuda.is_available()
    except ImportError:
        gpu = False
    return on_gpu(args) if gpu else logic_check(args.dir)


if __name__ == "__main__":
    sys.exit(main())
