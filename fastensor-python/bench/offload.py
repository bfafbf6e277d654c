"""Activation offload on a real CPU training step: no offload, activation checkpointing
(``torch.utils.checkpoint``), and ``fastensor.torch.offload`` at several budgets.

    python bench/offload.py [--dir DIR] [--blocks 48] [--width 64] [--tokens 2048]
                            [--min-bytes 262144] [--threads N]
                            [--rounds 5] [--budgets 10,20,40] [--cap-div 8]
                            [--sweep-widths 1024,512,...,8] [--sweep-blocks 8]
                            [--sweep-rounds 5]

The model is a stack of pre-norm MLP blocks (LayerNorm, Linear d->4d, GELU, Linear 4d->d,
residual), sized so its saved activations (about 40*d bytes a token a block) dominate
memory. One training step is forward + loss + backward. Every configuration runs once per
round after one warm-up step each, the rounds interleaved (the machine's speed swings
between rounds); each figure is the median over rounds.

Per configuration:
- act held: peak bytes of activations held. No offload: every saved tensor (counted by a
  pass-through saved_tensors_hook); checkpointing: the block inputs it keeps plus one
  block's activations during its recompute (computed from those counts); offload: the
  store's peak (``stats.peak_held_bytes``, its own accounting) plus the tensors left in
  memory (below ``min_bytes``).
- peak RSS: the process's peak resident memory during the step above its level before the
  step (VmHWM, reset through /proc/self/clear_refs; free heap returned first with
  malloc_trim, so each step faults its memory in as a fresh process would). What stays
  between steps (printed below the table) is not in it.
- every configuration runs with glibc's mmap threshold fixed at min_bytes (what offload sets,
  so that freed activations leave the process; see ``release_freed_memory``).
- time (wall) and CPU time (the process's, every thread), and their ratios to no offload's
  (median of the per-round ratios). On a machine shared with other work, wall time swings
  with the others' load; CPU time shows the work offload adds, the stall the waiting.
- stall: time backward waited in unpack; pack wait: time forward waited for the budget.

Then the largest batch that fits a memory cap, the peak RSS growth of a no-offload step at
tokens/cap_div: each configuration's peak RSS per token at the base batch predicts its
largest batch (offload's budget scaled with the batch); steps check it, bisecting between the
cap's batch and the prediction while over the cap (at most 8 steps): the largest batch found
within the cap is reported.

Last, the stall sweep: the width shrinks at constant activation bytes (compute per byte
falls with the width), at a budget of a tenth of the activations; per width, a block's
compute time (no offload's step over the blocks) against its I/O time (its offloaded bytes
at the write and the read rate the store measured), the slowdown, and the waits.

``compute/I/O`` in the first table is the same ratio for the whole step: no offload's step
time over the offloaded bytes' write and read time.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import statistics
import sys
import tempfile
import time
import weakref

import torch
from fastensor._offload import release_freed_memory
from fastensor.torch import offload
from torch import nn
from torch.utils.checkpoint import checkpoint

MIB = 1 << 20
#: Steps the largest-batch search may take per configuration.
SEARCH_STEPS = 8
_libc = ctypes.CDLL("libc.so.6")


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


def rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak() -> int:
    """Returns free heap to the system, resets the peak RSS, and returns the RSS now."""
    gc.collect()
    _libc.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_now()


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Peak bytes of saved tensors held (unique storages), through a pass-through hook."""
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


def param_storage_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def one_step(model: nn.Module, x: torch.Tensor, off: dict | None) -> dict:
    """One training step; its time, peak RSS growth, and offload figures."""
    base = reset_peak()
    t0, c0 = time.perf_counter(), time.process_time()
    if off is None:
        loss = model(x).square().mean()
        stats = None
    else:
        with offload(**off) as stats:
            loss = model(x).square().mean()
    loss.backward()
    del loss
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = peak_rss() - base
    out = {"time": dt, "cpu": cpu, "rss": peak}
    if stats is not None:
        gc.collect()
        d = stats.as_dict()
        out.update(
            held=d["peak_held_bytes"] + d["bytes_kept"],
            stall=d["unpack_stall_s"],
            wait=d["pack_wait_s"],
            written=d["bytes_written"],
            wgbps=stats.write_gbps,
            rgbps=stats.read_gbps,
        )
    return out


def fmt_bytes(n: float) -> str:
    return f"{n / MIB:8.1f}"


def make_model(d: int, blocks: int) -> Model:
    torch.manual_seed(0)
    m = Model(d, blocks)
    for p in m.parameters():  # grads exist from here on: not counted in a step's growth
        p.grad = torch.zeros_like(p)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch's compute threads (default: torch's own, one per core)",
    )
    ap.add_argument("--dir", default=None, help="swap directory (default: a temp dir)")
    ap.add_argument("--blocks", type=int, default=48)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=2048, help="tokens a step (batch x seq)")
    ap.add_argument("--min-bytes", type=int, default=256 << 10, help="offload's min_bytes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budgets", default="10,20,40", help="offload budgets: footprint/N")
    ap.add_argument("--cap-div", type=int, default=8, help="cap: no offload at tokens/N")
    ap.add_argument("--sweep-widths", default="1024,512,256,128,64,32,16,8")
    ap.add_argument("--sweep-rounds", type=int, default=5)
    ap.add_argument("--sweep-blocks", type=int, default=8)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # The malloc setting offload makes (freed blocks of 1 MiB or more go back to the system),
    # made first for every configuration alike.
    released = release_freed_memory(args.min_bytes)
    tmp = tempfile.TemporaryDirectory(dir=args.dir or os.environ.get("FASTENSOR_OFFLOAD_DIR"))
    sdir = tmp.name
    torch.manual_seed(0)
    d, L, T = args.width, args.blocks, args.tokens
    model = make_model(d, L)
    ckpt_model = make_model(d, L)
    ckpt_model.load_state_dict(model.state_dict())
    ckpt_model.ckpt = True
    x = torch.randn(T, d)
    footprint = saved_bytes(model, x)
    block_bytes = footprint // L
    # Checkpointing holds each block's input, and one block's activations in its recompute.
    ckpt_held = L * T * d * x.element_size() + block_bytes
    print(
        f"# fastensor offload benchmark: {L} MLP blocks, width {d}, {T} tokens; torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads; swap dir {sdir}; "
        f"malloc mmap threshold {args.min_bytes} B: {released}"
    )
    print(
        f"# saved activations {footprint / MIB:.1f} MiB ({block_bytes / MIB:.2f} MiB a block), "
        f"parameters {param_storage_bytes(model) / MIB:.1f} MiB"
    )
    configs: list[tuple[str, Model, dict | None]] = [
        ("no offload", model, None),
        ("checkpoint", ckpt_model, None),
    ]
    divs = [int(v) for v in args.budgets.split(",") if v]
    for div in divs:
        budget = max(footprint // div, 2 * MIB)
        configs.append(
            (
                f"offload F/{div}",
                model,
                {"dir": sdir, "budget_bytes": budget, "min_bytes": args.min_bytes},
            )
        )
    results: dict[str, list[dict]] = {name: [] for name, _, _ in configs}
    # Warm-up: first-touch costs, the engine's first choices. What the offload steps leave
    # resident (the I/O paths' pooled buffers among it) is measured across their warm-ups.
    for _name, m, off in configs:
        if off is None:
            one_step(m, x, off)
    rss_before = reset_peak()
    for _name, m, off in configs:
        if off is not None:
            one_step(m, x, off)
    for _ in range(args.rounds):
        for name, m, off in configs:
            results[name].append(one_step(m, x, off))
    rss_after = reset_peak()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    def slowdown(name: str, key: str = "time") -> float:
        pairs = zip(results[name], results["no offload"], strict=True)
        return statistics.median(r[key] / b[key] for r, b in pairs)

    print()
    print(
        "| configuration | budget MiB | act held MiB | footprint/held | peak RSS MiB "
        "| time s | slowdown | CPU s | CPU ratio | compute/I/O | stall s | pack wait s "
        "| write GB/s "
        "| read GB/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, _, off in configs:
        if off is None:
            held = footprint if name == "no offload" else ckpt_held
            budget, extra = "-", "| - | - | - | - | - |"
        else:
            held = med(name, "held")
            budget = f"{off['budget_bytes'] / MIB:.1f}"
            io = med(name, "written") / 1e9 * (1 / med(name, "wgbps") + 1 / med(name, "rgbps"))
            extra = (
                f"| {med('no offload', 'time') / io:.2f} "
                f"| {med(name, 'stall'):.3f} | {med(name, 'wait'):.3f} "
                f"| {med(name, 'wgbps'):.2f} | {med(name, 'rgbps'):.2f} |"
            )
        print(
            f"| {name} | {budget} | {held / MIB:.1f} | {footprint / held:.1f}x "
            f"| {med(name, 'rss') / MIB:.1f} | {med(name, 'time'):.3f} "
            f"| {slowdown(name):.3f}x | {med(name, 'cpu'):.3f} | {slowdown(name, 'cpu'):.3f}x "
            f"{extra}"
        )
    print()
    print(
        f"# resident between steps: {rss_before / MIB:.1f} MiB before the first offload step, "
        f"{rss_after / MIB:.1f} MiB after the rounds (what the offload steps left, the I/O "
        "paths' pooled buffers among it; not in a step's growth)"
    )
    print(
        "# rounds (wall s / CPU s): "
        + "; ".join(
            f"{name}: " + ", ".join(f"{r['time']:.2f}/{r['cpu']:.2f}" for r in results[name])
            for name, _, _ in configs
        )
    )

    # Largest batch within a memory cap: the no-offload step's peak RSS growth at
    # tokens/cap_div. Each configuration's peak RSS per token at the base batch predicts its
    # largest batch (offload's budget scaled with the batch); steps check it, bisecting
    # between the cap's batch and the prediction while over the cap.
    cap_tokens = T // args.cap_div
    xc = torch.randn(cap_tokens, d)
    one_step(model, xc, None)
    cap_runs = sorted((one_step(model, xc, None) for _ in range(3)), key=lambda r: r["rss"])
    cap_run = cap_runs[1]  # the median one: no offload's own row below
    cap = cap_run["rss"]
    del xc
    big = f"offload F/{max(divs)}"
    print()
    print(
        f"## largest batch within a cap of {cap / MIB:.1f} MiB of peak RSS growth "
        f"(no offload's at {cap_tokens} tokens)"
    )
    print(
        "| configuration | RSS per 1k tokens MiB (at base batch) | predicted max tokens "
        "| checked max tokens | its peak RSS MiB | its time s | vs no offload |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")

    def fits(name: str, m: Model, n: int) -> dict | None:
        """A step at ``n`` tokens after a warm-up step at that shape (a first step at a new
        shape allocates more: library caches, buffers of other lengths); its figures when its
        peak RSS growth is within the cap."""
        kw = None
        if name == big:
            kw = {
                "dir": sdir,
                "budget_bytes": max(footprint * n // T // max(divs), 2 * MIB),
                "min_bytes": args.min_bytes,
            }
        xb = torch.randn(n, d)
        one_step(m, xb, kw)  # warm-up at this shape, as every configuration gets above
        r = one_step(m, xb, kw)
        del xb
        return r if r["rss"] <= cap else None

    for name, m in (("no offload", model), ("checkpoint", ckpt_model), (big, model)):
        per_tok = med(name, "rss") / T
        predicted = max(1, int(cap / per_tok))
        if name == "no offload":
            best, best_r = cap_tokens, cap_run
        else:
            # Bisection between the cap's own batch (fits: no offload's) and the prediction,
            # SEARCH_STEPS probes (the prediction itself first), each a warm-up step and a
            # measured one.
            best, best_r = None, None
            lo, hi = cap_tokens, predicted
            probe = predicted
            for _ in range(SEARCH_STEPS):
                r = fits(name, m, probe)
                if r is not None:
                    best, best_r, lo = probe, r, probe
                    if probe == hi:
                        break
                else:
                    hi = probe - 1
                if hi <= lo:
                    break
                probe = (lo + hi + 1) // 2
        if best is None:
            print(f"| {name} | {per_tok * 1024 / MIB:.2f} | {predicted} | none found | - | - | - |")
            continue
        print(
            f"| {name} | {per_tok * 1024 / MIB:.2f} | {predicted} | {best} "
            f"| {best_r['rss'] / MIB:.1f} | {best_r['time']:.2f} | {best / cap_tokens:.1f}x |"
        )

    # The stall as compute shrinks: wider blocks do more compute per byte saved (a block's
    # matmuls grow with width squared a token, its activations with the width), so at
    # constant activation bytes the width sets compute against I/O.
    widths = [int(w) for w in args.sweep_widths.split(",") if w]
    Ls = args.sweep_blocks
    print()
    print(
        f"## stall as compute per byte shrinks ({Ls} blocks, budget = activations/10, "
        f"{args.sweep_rounds} interleaved rounds; compute/block = no offload's step time / "
        "blocks, I/O/block = a block's offloaded bytes at the store's write and read rates)"
    )
    print(
        "| width | tokens | act MiB | act/held | compute/block ms | I/O/block ms | compute/I/O "
        "| no offload s | offload s | slowdown | CPU ratio | stall s | pack wait s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for w in widths:
        tokens = max(1, T * d // w)
        m = make_model(w, Ls)
        xs = torch.randn(tokens, w)
        act = saved_bytes(m, xs) - param_storage_bytes(m)
        kw = {"dir": sdir, "budget_bytes": max(act // 10, 2 * MIB), "min_bytes": args.min_bytes}
        one_step(m, xs, None)
        one_step(m, xs, kw)
        rs = [(one_step(m, xs, None), one_step(m, xs, kw)) for _ in range(args.sweep_rounds)]
        tn = statistics.median(a["time"] for a, _ in rs)
        to = statistics.median(b["time"] for _, b in rs)
        sl = statistics.median(b["time"] / a["time"] for a, b in rs)
        sc = statistics.median(b["cpu"] / a["cpu"] for a, b in rs)
        st = statistics.median(b["stall"] for _, b in rs)
        wt = statistics.median(b["wait"] for _, b in rs)
        held = statistics.median(b["held"] for _, b in rs)
        io = statistics.median(
            b["written"] / 1e9 * (1 / b["wgbps"] + 1 / b["rgbps"])
            for _, b in rs
            if b["wgbps"] and b["rgbps"]
        )
        compute_ms, io_ms = tn / Ls * 1e3, io / Ls * 1e3
        print(
            f"| {w} | {tokens} | {act / MIB:.1f} | {act / held:.1f}x "
            f"| {compute_ms:.1f} | {io_ms:.1f} "
            f"| {compute_ms / io_ms:.2f} | {tn:.3f} | {to:.3f} | {sl:.3f}x | {sc:.3f}x "
            f"| {st:.3f} | {wt:.3f} |"
        )
        del m, xs
    tmp.cleanup()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
