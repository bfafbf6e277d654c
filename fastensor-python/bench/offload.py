"""Activation offload on a real CPU training loop: no offload, activation checkpointing
(``torch.utils.checkpoint``), and ``fastensor.torch.offload`` at several budgets.

    python bench/offload.py [--dir DIR] [--blocks 48] [--width 64] [--tokens 2048]
                            [--min-bytes 262144] [--threads N] [--rounds 5] [--steps 4]
                            [--budgets 10,20,40] [--cap-div 8]
                            [--sweep-widths 1024,512,...,16] [--sweep-blocks 24]
                            [--sweep-rounds 5] [--no-largest] [--no-sweep] [--json FILE]

The model is a stack of pre-norm MLP blocks (LayerNorm, Linear d->4d, GELU, Linear 4d->d,
residual), sized so its saved activations (about 40*d bytes a token a block) dominate
memory. A training step is forward + loss + backward, and steps run back to back as in a
training loop.

Every configuration runs in a process of its own, started once and kept for the whole run
(what offload and its caching allocator change is process-wide: glibc's and libc10's
allocation), with torch's defaults except what the configuration itself does: "no offload"
is a plain PyTorch process. Rounds are interleaved (each process in turn runs ``--steps``
steps; the order reverses every round, the machine's speed swings between rounds); a
round's figure is its median step, a ratio the median of the per-round ratios to no
offload.

Per configuration:
- act held: peak bytes of activations held. No offload: every saved tensor (counted by a
  pass-through saved_tensors_hook); checkpointing: the block inputs it keeps plus one
  block's activations during its recompute; offload: the store's peak (its own accounting)
  plus the tensors left in memory (below ``min_bytes``).
- peak RSS: the process's peak resident memory above its level with the model and input
  made and a one-token step run (which loads the code paths the configuration uses), every
  step after included: what a training process at this batch needs, caches and pools
  included.
- time (wall) and CPU time (the process's, every thread) a step.
- compute/I/O: no offload's step time over the offloaded bytes' write and read time at the
  per-transfer rates the store measured; stall: time backward waited in unpack; pack wait:
  time forward waited for the budget; in place: offloaded tensors backward took from their
  own memory (still alive: no read).

Then the largest batch within a memory cap (no offload's peak RSS growth at
tokens/cap_div): each configuration's peak RSS per token at the base batch predicts its
largest batch (offload's budget scaled with the batch); fresh processes check it,
bisecting between the cap's batch and the prediction while over the cap.

Last, the stall sweep: the width shrinks at constant activation bytes (compute per byte
falls with the width), at a budget of a tenth of the activations (which spans 2.4 of the 24
blocks: a block's writes overlap the next blocks' compute); per width, a block's compute
time (no offload's step over the blocks) against its I/O time, the slowdown and the waits,
and checkpointing's slowdown beside it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import weakref

MIB = 1 << 20
#: Steps the largest-batch search may take per configuration.
SEARCH_STEPS = 8
#: Steps a worker runs before it is measured (first-touch costs, the engine's first picks).
WARM_UP_STEPS = 2


# ---------------------------------------------------------------- the worker process


def _model_classes():
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class Block(nn.Module):
        """Pre-norm MLP block: x + W2 gelu(W1 ln(x))."""

        def __init__(self, d: int):
            super().__init__()
            self.ln = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))

    class Model(nn.Module):
        def __init__(self, d: int, blocks: int, ckpt: bool = False):
            super().__init__()
            self.blocks = nn.ModuleList(Block(d) for _ in range(blocks))
            self.ckpt = ckpt

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
            return x

    return Model


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def saved_bytes(model, x) -> int:
    """Peak bytes of saved tensors held (unique storages), through a pass-through hook."""
    import torch

    live: dict[int, int] = {}
    peak = [0]

    class Tag:
        __slots__ = ("t", "__weakref__")

    def pack(t: torch.Tensor) -> Tag:
        s = t.untyped_storage()
        key = s.data_ptr()
        if key not in live:
            live[key] = s.nbytes()
            peak[0] = max(peak[0], sum(live.values()))
        tag = Tag()
        tag.t = t
        weakref.finalize(tag, live.pop, key, None)
        return tag

    def unpack(tag: Tag) -> torch.Tensor:
        return tag.t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = model(x).square().mean()
    loss.backward()
    return peak[0]


class Worker:
    """One configuration's training loop, in its own process."""

    def __init__(self, spec: dict):
        import torch

        if spec.get("threads"):
            torch.set_num_threads(spec["threads"])
        self.spec = spec
        model_cls = _model_classes()
        torch.manual_seed(0)
        d, blocks, tokens = spec["width"], spec["blocks"], spec["tokens"]
        self.model = model_cls(d, blocks, ckpt=spec["kind"] == "checkpoint")
        for p in self.model.parameters():  # gradients exist from the start
            p.grad = torch.zeros_like(p)
        self.x = torch.randn(tokens, d)
        self.params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.allocator = None
        if spec["kind"] == "alloc":
            from fastensor.torch import caching_allocator

            self.allocator = caching_allocator(spec["min_bytes"]).__enter__()
        # A one-token step first loads the code each configuration uses lazily (modules
        # that checkpointing and offload import, the engine): the memory measured from here
        # is the training step's.
        full, self.x = self.x, self.x[:1].clone()
        self.step()
        self.x = full
        gc.collect()
        self.rss_base = rss_now()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM from here
        self.footprint = None
        if spec.get("footprint"):
            self.footprint = saved_bytes(self.model, self.x)
        for _ in range(WARM_UP_STEPS):
            self.step()

    def step(self) -> dict:
        spec = self.spec
        t0, c0 = time.perf_counter(), time.process_time()
        if spec["kind"] == "offload":
            from fastensor.torch import offload

            kw = {
                "dir": spec["dir"],
                "budget_bytes": spec["budget"],
                "min_bytes": spec["min_bytes"],
                "caching_allocator": spec.get("caching_allocator", True),
            }
            if spec.get("io_threads"):
                kw["io_threads"] = spec["io_threads"]
            if "prefetch" in spec:
                kw["prefetch"] = spec["prefetch"]
            with offload(**kw) as stats:
                loss = self.model(self.x).square().mean()
        else:
            stats = None
            loss = self.model(self.x).square().mean()
        loss.backward()
        del loss
        out = {"time": time.perf_counter() - t0, "cpu": time.process_time() - c0}
        if stats is not None:
            d = stats.as_dict()
            out.update(
                held=d["peak_held_bytes"] + d["bytes_kept"],
                stall=d["unpack_stall_s"],
                wait=d["pack_wait_s"],
                offloaded=d["bytes_offloaded"],
                written=d["bytes_written"],
                wgbps=stats.write_gbps,
                rgbps=stats.read_gbps,
                in_place=d["restored_in_place"],
                tensors=d["tensors_offloaded"],
                allocator=d["caching_allocator"],
            )
        return out

    def serve(self) -> None:
        reply({"ready": True, "footprint": self.footprint, "params": self.params})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("quit"):
                return
            steps = [self.step() for _ in range(cmd["steps"])]
            reply({"steps": steps, "peak_rss": peak_rss() - self.rss_base})


def reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def worker_main() -> None:
    spec = json.loads(sys.stdin.readline())
    Worker(spec).serve()


# ---------------------------------------------------------------- the orchestrator


class Proc:
    """A worker process running one configuration."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.send(spec)
        self.ready = self.recv()

    def send(self, obj: dict) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(obj) + "\n")
        self.p.stdin.flush()

    def recv(self) -> dict:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.spec['name']} died (exit {self.p.wait()})")
        return json.loads(line)

    def run(self, steps: int) -> dict:
        self.send({"steps": steps})
        return self.recv()

    def close(self) -> None:
        if self.p.poll() is None:
            self.send({"quit": True})
            self.p.wait(60)


def med(xs) -> float:
    return statistics.median(xs)


def round_figures(result: dict) -> dict:
    """A round's figures: the median step (time, CPU and offload's figures)."""
    steps = result["steps"]
    out = {k: med(s[k] for s in steps) for k in steps[0] if k != "allocator"}
    out["peak_rss"] = result["peak_rss"]
    out["allocator"] = steps[-1].get("allocator")
    return out


def interleaved(procs: dict[str, Proc], rounds: int, steps: int) -> dict[str, list[dict]]:
    """Each process runs ``steps`` steps in turn, ``rounds`` times (order reversed every
    other round); per process, its rounds' figures."""
    names = list(procs)
    out: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            out[name].append(round_figures(procs[name].run(steps)))
    return out


def ratio(rs: list[dict], base: list[dict], key: str = "time") -> float:
    return med(r[key] / b[key] for r, b in zip(rs, base, strict=True))


def io_time(rs: list[dict]) -> float:
    """The offloaded bytes' write and read time at the store's per-transfer rates."""
    return med(
        r["written"] / 1e9 * (1 / r["wgbps"] + 1 / r["rgbps"])
        for r in rs
        if r["wgbps"] and r["rgbps"]
    )


def main() -> None:
    if "--worker" in sys.argv:
        worker_main()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch's compute threads")
    ap.add_argument("--dir", default=None, help="swap directory (default: a temp dir)")
    ap.add_argument("--blocks", type=int, default=48)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens a step (batch x seq)")
    ap.add_argument("--min-bytes", type=int, default=256 << 10, help="offload's min_bytes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4, help="steps a configuration runs a round")
    ap.add_argument("--budgets", default="10,20,40", help="offload budgets: footprint/N")
    ap.add_argument("--cap-div", type=int, default=8, help="cap: no offload at tokens/N")
    ap.add_argument("--sweep-widths", default="1024,512,256,128,64,32,16")
    ap.add_argument("--sweep-rounds", type=int, default=5)
    # A budget of a tenth of the activations spans 2.4 blocks at 24 (below one block at 8:
    # a block's writes could not overlap the next block's compute, which the sweep is about).
    ap.add_argument("--sweep-blocks", type=int, default=24)
    ap.add_argument("--no-largest", action="store_true", help="skip the largest-batch search")
    ap.add_argument("--no-sweep", action="store_true", help="skip the stall sweep")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    args = ap.parse_args()

    import torch

    tmp = tempfile.TemporaryDirectory(dir=args.dir or os.environ.get("FASTENSOR_OFFLOAD_DIR"))
    sdir = tmp.name
    d, L, T = args.width, args.blocks, args.tokens
    common = {"width": d, "blocks": L, "min_bytes": args.min_bytes, "threads": args.threads}
    threads = args.threads or torch.get_num_threads()
    report: dict = {"args": vars(args), "torch": torch.__version__, "threads": threads}

    base = Proc({**common, "name": "no offload", "kind": "none", "tokens": T, "footprint": 1})
    footprint = base.ready["footprint"]
    block_bytes = footprint // L
    ckpt_held = L * T * d * 4 + block_bytes
    print(
        f"# fastensor offload benchmark: {L} MLP blocks, width {d}, {T} tokens; torch "
        f"{torch.__version__}, {threads} threads; swap dir {sdir}"
    )
    print(
        f"# saved activations {footprint / MIB:.1f} MiB ({block_bytes / MIB:.2f} MiB a block), "
        f"parameters {base.ready['params'] / MIB:.1f} MiB; {args.rounds} interleaved rounds "
        f"of {args.steps} steps after {WARM_UP_STEPS} warm-up steps, one process a "
        "configuration"
    )
    divs = [int(v) for v in args.budgets.split(",") if v]
    specs = [
        {**common, "name": "no offload + caching allocator", "kind": "alloc", "tokens": T},
        {**common, "name": "checkpointing", "kind": "checkpoint", "tokens": T},
    ]
    for div in divs:
        specs.append(
            {
                **common,
                "name": f"offload F/{div}",
                "kind": "offload",
                "tokens": T,
                "dir": sdir,
                "budget": max(footprint // div, 2 * MIB),
            }
        )
    big = f"offload F/{max(divs)}"
    specs.append(
        {
            **next(s for s in specs if s["name"] == big),
            "name": f"{big}, no caching allocator",
            "caching_allocator": False,
        }
    )
    procs = {"no offload": base}
    for spec in specs:
        procs[spec["name"]] = Proc(spec)
    results = interleaved(procs, args.rounds, args.steps)
    for p in procs.values():
        p.close()
    nb = results["no offload"]

    print()
    print(
        "| configuration | budget MiB | act held MiB | footprint/held | peak RSS MiB "
        "| step s | slowdown | CPU s | CPU ratio | compute/I/O | stall s | pack wait s "
        "| write GB/s | read GB/s | in place |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, rs in results.items():
        spec = procs[name].spec
        if spec["kind"] != "offload":
            held = ckpt_held if spec["kind"] == "checkpoint" else footprint
            budget, extra = "-", "| - | - | - | - | - | - |"
        else:
            held = med(r["held"] for r in rs)
            budget = f"{spec['budget'] / MIB:.1f}"
            extra = (
                f"| {med(r['time'] for r in nb) / io_time(rs):.2f} "
                f"| {med(r['stall'] for r in rs):.3f} | {med(r['wait'] for r in rs):.3f} "
                f"| {med(r['wgbps'] for r in rs):.2f} | {med(r['rgbps'] for r in rs):.2f} "
                f"| {med(r['in_place'] for r in rs):.0f}/{med(r['tensors'] for r in rs):.0f} |"
            )
        row = {
            "name": name,
            "held": held,
            "peak_rss": med(r["peak_rss"] for r in rs),
            "time": med(r["time"] for r in rs),
            "slowdown": ratio(rs, nb),
            "cpu": med(r["cpu"] for r in rs),
            "cpu_ratio": ratio(rs, nb, "cpu"),
        }
        rows.append(row)
        print(
            f"| {name} | {budget} | {held / MIB:.1f} | {footprint / held:.1f}x "
            f"| {row['peak_rss'] / MIB:.1f} | {row['time']:.3f} | {row['slowdown']:.3f}x "
            f"| {row['cpu']:.3f} | {row['cpu_ratio']:.3f}x {extra}"
        )
    report["main"] = {"rows": rows, "rounds": results}
    print(
        "# rounds (step s): "
        + "; ".join(
            f"{name}: " + ", ".join(f"{r['time']:.3f}" for r in rs) for name, rs in results.items()
        )
    )

    if not args.no_largest:
        report["largest"] = largest_batch(args, common, sdir, footprint, results, divs)
    if not args.no_sweep:
        report["sweep"] = sweep(args, common, sdir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    tmp.cleanup()


def largest_batch(args, common, sdir, footprint, results, divs) -> list[dict]:
    """The largest batch within no offload's peak RSS growth at tokens/cap_div."""
    T = args.tokens
    cap_tokens = T // args.cap_div

    def probe(kind: str, n: int, budget_div: int | None = None) -> dict:
        spec = {**common, "name": kind, "kind": kind, "tokens": n}
        if budget_div:
            spec.update(dir=sdir, budget=max(footprint * n // T // budget_div, 2 * MIB))
        p = Proc(spec)
        try:
            r = round_figures(p.run(2))
        finally:
            p.close()
        return r

    cap_run = probe("none", cap_tokens)
    cap = cap_run["peak_rss"]
    big = f"offload F/{max(divs)}"
    print()
    print(
        f"## largest batch within a cap of {cap / MIB:.1f} MiB of peak RSS growth "
        f"(no offload's at {cap_tokens} tokens; a fresh process a probe)"
    )
    print(
        "| configuration | RSS per 1k tokens MiB (at base batch) | predicted max tokens "
        "| checked max tokens | its peak RSS MiB | its step s | vs no offload |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    out = []
    for name, kind, div in (
        ("no offload", "none", None),
        ("checkpointing", "checkpoint", None),
        (big, "offload", max(divs)),
    ):
        per_tok = med(r["peak_rss"] for r in results[name]) / T
        predicted = max(1, int(cap / per_tok))
        if kind == "none":
            best, best_r = cap_tokens, cap_run
        else:
            best, best_r = None, None
            lo, hi, n = cap_tokens, predicted, predicted
            for _ in range(SEARCH_STEPS):
                r = probe(kind, n, div)
                if r["peak_rss"] <= cap:
                    best, best_r, lo = n, r, n
                    if n == hi:
                        break
                else:
                    hi = n - 1
                if hi <= lo:
                    break
                n = (lo + hi + 1) // 2
        row = {"name": name, "per_1k": per_tok * 1024, "predicted": predicted, "tokens": best}
        out.append(row)
        if best is None:
            print(f"| {name} | {per_tok * 1024 / MIB:.2f} | {predicted} | none found | - | - | - |")
            continue
        row.update(peak_rss=best_r["peak_rss"], time=best_r["time"])
        print(
            f"| {name} | {per_tok * 1024 / MIB:.2f} | {predicted} | {best} "
            f"| {best_r['peak_rss'] / MIB:.1f} | {best_r['time']:.2f} | {best / cap_tokens:.1f}x |"
        )
    return out


def sweep(args, common, sdir) -> list[dict]:
    """Slowdown and stall as compute per byte shrinks, at constant activation bytes."""
    widths = [int(w) for w in args.sweep_widths.split(",") if w]
    Ls = args.sweep_blocks
    T, d = args.tokens, args.width
    print()
    print(
        f"## stall as compute per byte shrinks ({Ls} blocks, offload's budget = activations/10, "
        f"{args.sweep_rounds} interleaved rounds of {args.steps} steps; compute/block = no "
        "offload's step time / blocks, I/O/block = a block's offloaded bytes at the store's "
        "write and read rates)"
    )
    print(
        "| width | tokens | act MiB | act/held | compute/block ms | I/O/block ms | compute/I/O "
        "| no offload s | offload s | slowdown | CPU ratio | stall s | pack wait s "
        "| checkpointing s | its slowdown |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    out = []
    for w in widths:
        tokens = max(1, T * d // w)
        sweep_common = {**common, "width": w, "blocks": Ls, "tokens": tokens}
        none = Proc({**sweep_common, "name": "none", "kind": "none", "footprint": 1})
        act = none.ready["footprint"] - none.ready["params"]
        off = Proc(
            {
                **sweep_common,
                "name": "offload",
                "kind": "offload",
                "dir": sdir,
                "budget": max(act // 10, 2 * MIB),
            }
        )
        ckpt = Proc({**sweep_common, "name": "checkpointing", "kind": "checkpoint"})
        procs = {"none": none, "off": off, "ckpt": ckpt}
        res = interleaved(procs, args.sweep_rounds, args.steps)
        for p in procs.values():
            p.close()
        a, b, c = res["none"], res["off"], res["ckpt"]
        tn = med(r["time"] for r in a)
        io = io_time(b)
        held = med(r["held"] for r in b)
        compute_ms, io_ms = tn / Ls * 1e3, io / Ls * 1e3
        row = {
            "width": w,
            "tokens": tokens,
            "act": act,
            "held": held,
            "compute_ms": compute_ms,
            "io_ms": io_ms,
            "none": tn,
            "off": med(r["time"] for r in b),
            "slowdown": ratio(b, a),
            "cpu_ratio": ratio(b, a, "cpu"),
            "stall": med(r["stall"] for r in b),
            "wait": med(r["wait"] for r in b),
            "checkpointing": med(r["time"] for r in c),
            "checkpointing_slowdown": ratio(c, a),
        }
        out.append(row)
        print(
            f"| {w} | {tokens} | {act / MIB:.1f} | {act / held:.1f}x "
            f"| {compute_ms:.1f} | {io_ms:.1f} | {compute_ms / io_ms:.2f} "
            f"| {tn:.3f} | {row['off']:.3f} | {row['slowdown']:.3f}x | {row['cpu_ratio']:.3f}x "
            f"| {row['stall']:.3f} | {row['wait']:.3f} "
            f"| {row['checkpointing']:.3f} | {row['checkpointing_slowdown']:.3f}x |"
        )
        sys.stdout.flush()
    return out


if __name__ == "__main__":
    main()
