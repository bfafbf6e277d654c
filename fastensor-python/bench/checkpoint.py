"""Checkpoint benchmark: fastensor.torch against torch.save/torch.load and safetensors.torch.

A GPT-2-medium-shaped state dict (292 f32 tensors, about 1.42 GB). Every save is durable
(file and directory fsynced; fastensor's saves are by design), every load is cold (the
file's page cache dropped with fsync + POSIX_FADV_DONTNEED first) and touches every page
of what it returns. Each round runs every row once, in its own shuffled order; the table
gives the median over the rounds and ratios measured within the same run.

    python fastensor-python/bench/checkpoint.py --dir DIR [--rounds 5] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path

import _util  # the bench's own helpers, beside this file
import fastensor
import fastensor.torch as ft
import safetensors.torch as st
import torch
from _util import drop_file_cache, durable, interleaved, touch


def gpt2_medium_shapes(scale: float) -> dict[str, tuple[int, ...]]:
    """The tensor shapes of GPT-2 medium; ``scale`` shrinks matrices."""
    d = 1024

    def rows(r: int) -> int:
        return max(1, round(r * scale))

    shapes = {"wte.weight": (rows(50257), d), "wpe.weight": (rows(1024), d)}
    for layer in range(24):
        p = f"h.{layer}."
        shapes.update(
            {
                p + "ln_1.weight": (d,),
                p + "ln_1.bias": (d,),
                p + "attn.c_attn.weight": (rows(d), 3 * d),
                p + "attn.c_attn.bias": (3 * d,),
                p + "attn.c_proj.weight": (rows(d), d),
                p + "attn.c_proj.bias": (d,),
                p + "ln_2.weight": (d,),
                p + "ln_2.bias": (d,),
                p + "mlp.c_fc.weight": (rows(d), 4 * d),
                p + "mlp.c_fc.bias": (4 * d,),
                p + "mlp.c_proj.weight": (rows(4 * d), d),
                p + "mlp.c_proj.bias": (d,),
            }
        )
    shapes["ln_f.weight"] = (d,)
    shapes["ln_f.bias"] = (d,)
    return shapes


def gpt2_medium(scale: float) -> dict[str, torch.Tensor]:
    """The tensors of GPT-2 medium, filled with random values; ``scale`` shrinks matrices."""
    g = torch.Generator().manual_seed(0)
    return {k: torch.randn(s, generator=g) for k, s in gpt2_medium_shapes(scale).items()}


class Model(torch.nn.Module):
    """A module whose state_dict has exactly the given names and shapes."""

    def __init__(self, shapes: dict[str, torch.Size]):
        super().__init__()
        for name, shape in shapes.items():
            *path, leaf = name.split(".")
            mod = self
            for part in path:
                if not hasattr(mod, part):
                    mod.add_module(part, torch.nn.Module())
                mod = getattr(mod, part)
            mod.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dir", type=Path, default=None, help="scratch directory (default: a temp dir)"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the matrices (quick runs)")
    ap.add_argument("--json", type=Path, default=None, help="write every timing here")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    base = _util.scratch("fastensor-ckpt-bench-", args.dir)

    sd = gpt2_medium(args.scale)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    model = Model({k: v.shape for k, v in sd.items()})
    for p in model.parameters():
        p.data.fill_(1.0)  # faulted in: an existing model's memory
    engine = fastensor.Engine(profile=os.fspath(base / "profile.toml"))

    ours, theirs, pickled = base / "ours.safetensors", base / "st.safetensors", base / "torch.pt"
    ft.save_file(sd, ours, engine=engine)
    st.save_file(sd, theirs)
    torch.save(sd, pickled)
    for p in (ours, theirs, pickled):
        durable(p)

    def save_fastensor(out: Path) -> float:
        t0 = time.perf_counter()
        ft.save_file(sd, out, engine=engine)
        return time.perf_counter() - t0

    def save_async_blocking(out: Path) -> float:
        t0 = time.perf_counter()
        handle = ft.save_file_async(sd, out, engine=engine)
        blocked = time.perf_counter() - t0
        handle.wait()
        return blocked

    def save_async_total(out: Path) -> float:
        t0 = time.perf_counter()
        ft.save_file_async(sd, out, engine=engine).wait()
        return time.perf_counter() - t0

    def save_torch(out: Path) -> float:
        t0 = time.perf_counter()
        torch.save(sd, out)
        durable(out)
        return time.perf_counter() - t0

    def save_safetensors(out: Path) -> float:
        t0 = time.perf_counter()
        st.save_file(sd, out)
        durable(out)
        return time.perf_counter() - t0

    def timed_load(path: Path, fn) -> float:
        drop_file_cache([path])
        gc.collect()
        t0 = time.perf_counter()
        result = fn(path)
        if isinstance(result, dict):
            touch(result.values())
        dt = time.perf_counter() - t0
        del result
        return dt

    rows = {
        "save: fastensor save_file": ("save", save_fastensor),
        "save: fastensor save_file_async, blocking part": ("save", save_async_blocking),
        "save: fastensor save_file_async, until wait() returns": ("save", save_async_total),
        "save: safetensors.torch.save_file + fsync": ("save", save_safetensors),
        "save: torch.save + fsync": ("save", save_torch),
        "load: fastensor load_file": (
            "load",
            lambda: timed_load(ours, lambda p: ft.load_file(p, engine=engine)),
        ),
        "load: safetensors.torch.load_file": ("load", lambda: timed_load(theirs, st.load_file)),
        "load: torch.load": (
            "load",
            lambda: timed_load(pickled, lambda p: torch.load(p, weights_only=True)),
        ),
        "resume: fastensor load_into(model)": (
            "load",
            lambda: timed_load(
                ours, lambda p: (ft.load_into(model, p, engine=engine), touch(model.parameters()))
            ),
        ),
        "resume: safetensors load_file + load_state_dict": (
            "load",
            lambda: timed_load(theirs, lambda p: model.load_state_dict(st.load_file(p))),
        ),
    }

    def run(name: str) -> float:
        kind, fn = rows[name]
        if kind == "save":
            out = base / f"save-{abs(hash(name))}.out"
            dt = fn(out)
            os.sync()
            out.unlink()
            return dt
        return fn()

    # One untimed round: the engine explores its backends here (and learns its profile).
    print(f"state dict: {len(sd)} tensors, {nbytes / 1e9:.3f} GB; scratch {base}", flush=True)
    for name in rows:
        run(name)
    times: dict[str, list[float]] = {n: [] for n in rows}
    for r, order in interleaved(rows, args.rounds, args.seed):
        for name in order:
            os.sync()
            time.sleep(0.5)
            times[name].append(run(name))
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    med = {n: statistics.median(v) for n, v in times.items()}

    def ratio(a: str, b: str) -> str:
        per_round = [tb / ta for ta, tb in zip(times[a], times[b], strict=True)]
        return f"{statistics.median(per_round):.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"

    print()
    print(
        f"GPT-2-medium-shaped state dict, {len(sd)} tensors, {nbytes / 1e9:.2f} GB f32; "
        f"{args.rounds} rounds, shuffled; medians"
    )
    print()
    print("| row | median s | GB/s |")
    print("|---|---|---|")
    for n in rows:
        print(f"| {n} | {med[n]:.3f} | {nbytes / med[n] / 1e9:.2f} |")
    goals = [
        (
            "durable save vs torch.save (goal >= 3x)",
            "save: fastensor save_file",
            "save: torch.save + fsync",
        ),
        (
            "durable save vs safetensors (goal >= 1.3x)",
            "save: fastensor save_file",
            "save: safetensors.torch.save_file + fsync",
        ),
        (
            "load_into vs load_file + load_state_dict (goal >= 3x)",
            "resume: fastensor load_into(model)",
            "resume: safetensors load_file + load_state_dict",
        ),
        (
            "load_file vs safetensors load_file (goal >= 1.2x)",
            "load: fastensor load_file",
            "load: safetensors.torch.load_file",
        ),
        ("load_file vs torch.load (goal >= 2x)", "load: fastensor load_file", "load: torch.load"),
    ]
    print()
    print("| ratio (per-round median, range) | value |")
    print("|---|---|")
    for label, a, b in goals:
        print(f"| {label} | {ratio(a, b)} |")
    blocking = statistics.median(
        tb / ta
        for ta, tb in zip(
            times["save: fastensor save_file"],
            times["save: fastensor save_file_async, blocking part"],
            strict=True,
        )
    )
    print(f"| save_file_async blocking / save_file (goal <= 25%) | {blocking:.1%} |")
    print()
    print(engine.report())
    if args.json:
        args.json.write_text(json.dumps({"bytes": nbytes, "times": times}, indent=1))
    for p in base.iterdir():
        p.unlink()
    base.rmdir()


if __name__ == "__main__":
    main()
