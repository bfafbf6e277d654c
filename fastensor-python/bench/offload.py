"""Activation offload as users meet it: training under a memory limit the kernel enforces.

    python bench/offload.py [--models deep,shallow] [--configs none,checkpoint,paper,fastensor,
                            fastensor+checkpoint] [--steps 8] [--search-steps 3] [--rounds 3]
                            [--base-batch 4] [--budget-layers 1] [--equal-budget-layers L]
                            [--skip-largest] [--at-ratio R [--uncapped-reference]]
                            [--dir DIR] [--json FILE] [--out FILE] [--quick]

Models: stacks of ``torch.nn.TransformerEncoderLayer`` (pre-norm, torch's defaults otherwise:
feed-forward 2048, dropout 0.1) trained with SGD on random tokens:

- ``deep``: 32 layers, d_model 256, 4 heads, 128 tokens a sequence;
- ``shallow``: 8 layers, d_model 384, 6 heads, 256 tokens a sequence;
- ``mlp``: 24 pre-norm MLP blocks (d 512 -> 2048 -> 512), 128 tokens a sequence;
- ``tiny``: 8 layers, d_model 128, 2 heads, 64 tokens a sequence (a smoke run: ``--quick``).

Configurations (the model and seed are the same in all):

- ``none``: no offload;
- ``checkpoint``: activation checkpointing of every layer (``torch.utils.checkpoint``,
  non-reentrant);
- ``paper``: the paper's scheme, saved-tensor hooks that ``torch.save`` each saved tensor
  of 1 MiB or more to a file and ``torch.load`` it back in backward;
- ``fastensor``: ``fastensor.torch.offload(dir=..., budget_bytes=...)`` with its defaults,
  the budget one layer's saved activations at that batch (``--budget-layers``);
- ``fastensor+checkpoint``: the same, with every layer checkpointed (reentrant: each layer's
  input goes to the store, the rest is recomputed in backward);
- ``unpacked``: ``fastensor`` with ``pack=False`` (every byte crosses to the disk as it is;
  not run unless named).

Memory: every run is a process of its own in a memory cgroup of its own (v2 where the
machine has it, else v1) whose limit is the cap: what the kernel charges (interpreter, torch,
model, gradients, allocator caches, page cache) counts, and a run that needs more is killed.
Each step's peak is the cgroup's (``memory.peak`` / ``memory.max_usage_in_bytes``, reset
before the step). The libraries are read by this process first, so their cached pages are
charged here and alike in every run.

1. The cap: no offload at ``--base-batch`` and one sequence more, each in a fresh process
   without a limit; the cap lies halfway between their peaks (the last step's), so no
   offload's largest batch is the base batch.
2. The largest batch each configuration runs under the cap: batches double from the base
   until one fails, then bisect (to a sixteenth), ``--search-steps`` steps a probe; the
   largest is then run ``--steps`` steps, which gives its tokens/s (median step after the
   first two) and shows whether its memory stays flat (the last steps' peaks against the
   third's).
3. Equal batch (no offload's largest): ``--rounds`` rounds, a fresh process per configuration
   and round, the order changing every round; step time as a ratio to no offload's in the
   same round, and a layer's compute (no offload's step over the layers) against its I/O
   (its offloaded bytes at the rates the store measured). ``--equal-budget-layers`` gives
   these runs a budget of their own (a batch that fits without offload leaves room to hold
   more of it); ``--skip-largest`` runs only the cap and this part.
4. With ``--at-ratio R``: every configuration but no offload at R times no offload's batch
   under the cap (``--rounds`` rounds, fresh processes, no offload at its batch in the same
   rounds): tokens/s at a batch with room left under the cap, where the largest batch runs
   at the cap itself (the kernel reclaiming all the while). ``--uncapped-reference`` adds no
   offload at that batch without a cap in the same rounds (it needs that memory): what
   offload itself costs at that batch, apart from what the batch costs.

Parts 3 and 4 also give the machine's steal time a step (``/proc/stat``, the median after
the first two steps): on a virtual machine whose disk is served by the host's CPUs, the
time those CPUs took from this machine's while it computed, which each byte moved adds to.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _util import interleaved, write_report  # noqa: E402

MIB = 1 << 20

MODELS = {
    "deep": {"layers": 32, "d": 256, "heads": 4, "seq": 128, "kind": "transformer"},
    "shallow": {"layers": 8, "d": 384, "heads": 6, "seq": 256, "kind": "transformer"},
    "mlp": {"layers": 24, "d": 512, "heads": 0, "seq": 128, "kind": "mlp"},
    "tiny": {"layers": 8, "d": 128, "heads": 2, "seq": 64, "kind": "transformer"},
}
CONFIGS = ["none", "checkpoint", "paper", "fastensor", "fastensor+checkpoint"]
OPTIONAL_CONFIGS = ["unpacked"]
#: The ``--uncapped-reference`` run's name: no offload at the ``--at-ratio`` batch, no cap.
NO_CAP = "none, no cap"


# ---------------------------------------------------------------- the worker process


def build(spec: dict):
    import torch
    from torch import nn

    torch.manual_seed(0)
    d, n = spec["d"], spec["layers"]
    if spec["kind"] == "transformer":
        layers = [
            nn.TransformerEncoderLayer(d, spec["heads"], batch_first=True, norm_first=True)
            for _ in range(n)
        ]
    else:

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.ln, self.fc1, self.fc2 = (
                    nn.LayerNorm(d),
                    nn.Linear(d, 4 * d),
                    nn.Linear(4 * d, d),
                )

            def forward(self, x):
                return x + self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))

        layers = [Block() for _ in range(n)]
    return nn.ModuleList(layers)


def paper_hooks(directory: str):
    """The paper's scheme: every saved tensor of 1 MiB or more through torch.save/torch.load."""
    import torch

    count = [0]

    def pack(t):
        if t.untyped_storage().nbytes() < MIB:
            return t
        count[0] += 1
        path = os.path.join(directory, f"saved-{os.getpid()}-{count[0]}.pt")
        torch.save(t, path)
        return path

    def unpack(p):
        if isinstance(p, torch.Tensor):
            return p
        t = torch.load(p, weights_only=True)
        os.unlink(p)
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class CgroupPeak:
    """The peak memory of this process's cgroup, reset on demand."""

    def __init__(self, path: str | None):
        self.path = path
        if path is None:
            self.file = None
        elif os.path.exists(os.path.join(path, "memory.peak")):
            self.file = os.path.join(path, "memory.peak")
        else:
            self.file = os.path.join(path, "memory.max_usage_in_bytes")

    def reset(self) -> None:
        if self.file:
            with contextlib.suppress(OSError), open(self.file, "w") as f:
                f.write("0")

    def read(self) -> int:
        if not self.file:
            return rss_peak()
        with open(self.file) as f:
            return int(f.read().split()[0])


def steal_seconds() -> float:
    """The hypervisor's steal time of the whole machine so far (``/proc/stat``; 0 where the
    kernel does not count it): CPU time the host took from this VM's vCPUs while they had
    work. On a VM whose disk is served by the host's CPUs, each byte moved shows up here."""
    with contextlib.suppress(OSError, IndexError, ValueError), open("/proc/stat") as f:
        fields = f.readline().split()
        if fields[0] == "cpu":
            return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    return 0.0


def rss_peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def worker(spec: dict) -> None:
    import torch
    from torch.utils.checkpoint import checkpoint

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    layers = build(spec)
    opt = torch.optim.SGD(layers.parameters(), lr=1e-3)
    batch, seq, d = spec["batch"], spec["seq"], spec["d"]
    # The input requires grad, as an embedding's output does (a reentrant checkpoint of the
    # first layer needs it).
    x = torch.randn(batch, seq, d, requires_grad=True)
    config = spec["config"]
    peak = CgroupPeak(spec.get("cgroup"))
    reentrant = config == "fastensor+checkpoint"

    def forward(h):
        for layer in layers:
            if config in ("checkpoint", "fastensor+checkpoint"):
                h = checkpoint(layer, h, use_reentrant=reentrant)
            else:
                h = layer(h)
        return h

    def hooks():
        if config.startswith("fastensor") or config == "unpacked":
            from fastensor.torch import offload

            return offload(dir=spec["dir"], budget_bytes=spec["budget"], pack=config != "unpacked")
        if config == "paper":
            return paper_hooks(spec["dir"])
        return contextlib.nullcontext()

    for _ in range(spec["steps"]):
        peak.reset()
        steal0 = steal_seconds()
        t0 = time.perf_counter()
        with hooks() as stats:
            loss = forward(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        del loss
        out = {
            "time": time.perf_counter() - t0,
            "peak": peak.read(),
            "steal": steal_seconds() - steal0,
        }
        if stats is not None and hasattr(stats, "as_dict"):
            s = stats.as_dict()
            out.update(
                written=s["bytes_written"],
                read=s["bytes_read"],
                file_written=s["file_bytes_written"],
                file_read=s["file_bytes_read"],
                write_s=s["write_time_s"],
                read_s=s["read_time_s"],
                stall=s["unpack_stall_s"],
                wait=s["put_wait_s"],
                pool=s["caching_allocator"],
            )
        print(json.dumps(out), flush=True)


def footprint(spec: dict) -> int:
    """Bytes of the activations one layer saves at one sequence (in this process)."""
    import torch

    layers = build({**spec, "layers": 1})
    x = torch.randn(1, spec["seq"], spec["d"])
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        seen.setdefault(s.data_ptr(), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layers[0](x).sum()
    params = {p.untyped_storage().data_ptr() for p in layers.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)


# ---------------------------------------------------------------- cgroups


class Cgroups:
    """Memory cgroups under this process's own, one per run."""

    def __init__(self):
        self.v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
        if self.v2:
            rel = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
            self.base = "/sys/fs/cgroup" + rel
        else:
            rel = next(line.split(":", 2)[2] for line in lines if line.split(":")[1] == "memory")
            self.base = "/sys/fs/cgroup/memory" + rel
        self.count = 0

    def make(self, limit: int | None) -> str:
        self.count += 1
        path = os.path.join(self.base, f"fastensor-bench-{os.getpid()}-{self.count}")
        os.mkdir(path)
        if limit is not None:
            name = "memory.max" if self.v2 else "memory.limit_in_bytes"
            with open(os.path.join(path, name), "w") as f:
                f.write(str(limit))
            if self.v2:
                with (
                    contextlib.suppress(OSError),
                    open(os.path.join(path, "memory.swap.max"), "w") as f,
                ):
                    f.write("0")
        return path

    @staticmethod
    def remove(path: str) -> None:
        for _ in range(50):
            try:
                os.rmdir(path)
                return
            except OSError:
                time.sleep(0.1)


def run(spec: dict, cgroups: Cgroups, limit: int | None, timeout: float) -> dict:
    """Runs one configuration in a fresh process in a cgroup of its own: its steps, and
    whether it finished (``ok``) or why not."""
    path = cgroups.make(limit)

    def enter():
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    spec = {**spec, "cgroup": path}
    steps, why = [], None
    try:
        p = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=enter,
        )
        steps = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode != 0:
            why = "killed: out of memory" if p.returncode == -9 else f"exit {p.returncode}"
            tail = p.stderr.strip().splitlines()[-1:] if p.stderr else []
            if tail and p.returncode != -9:
                why += f" ({tail[0][:120]})"
    except subprocess.TimeoutExpired:
        why = f"over {timeout:.0f} s"
    finally:
        Cgroups.remove(path)
    return {"ok": why is None and len(steps) == spec["steps"], "why": why, "steps": steps}


# ---------------------------------------------------------------- the orchestrator


def med(xs) -> float:
    return statistics.median(xs)


def step_time(r: dict) -> float:
    """The median step after the first two (first-touch costs)."""
    s = r["steps"]
    return med(x["time"] for x in (s[2:] or s[-1:]))


def disk_bytes(step: dict) -> str:
    """GB written to / read from the disk in a step ("-" for a run without offload)."""
    if "file_written" not in step:
        return "-"
    return f"{step['file_written'] / 1e9:.2f} / {step['file_read'] / 1e9:.2f}"


def steal_time(r: dict) -> float:
    """The machine's steal time over a step (the median after the first two)."""
    s = r["steps"]
    return med(x.get("steal", 0.0) for x in (s[2:] or s[-1:]))


def flat(r: dict) -> tuple[bool, float]:
    """Whether the peaks of the steps after the third stay within 2% of the third's (and
    the growth, in MiB)."""
    peaks = [x["peak"] for x in r["steps"]]
    if len(peaks) < 4:
        return True, 0.0
    grow = max(peaks[3:]) - peaks[2]
    return grow <= 0.02 * peaks[2], grow / MIB


class Bench:
    def __init__(self, args):
        self.args = args
        self.cgroups = Cgroups()
        self.dir = args.dir
        self.report: dict = {"models": {}}
        self.lines: list[str] = []

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def spec(
        self, model: str, config: str, batch: int, steps: int, budget_layers: float | None = None
    ) -> dict:
        m = MODELS[model]
        per_layer = self.footprints[model] * batch
        layers = self.args.budget_layers if budget_layers is None else budget_layers
        budget = max(int(per_layer * layers), 4 * MIB)
        return {
            **m,
            "config": config,
            "batch": batch,
            "steps": steps,
            "dir": self.dir,
            "budget": budget,
            "threads": self.args.threads,
        }

    def probe(self, model, config, batch, steps, limit) -> dict:
        r = run(self.spec(model, config, batch, steps), self.cgroups, limit, self.args.timeout)
        state = "ok" if r["ok"] else r["why"]
        peak = max((x["peak"] for x in r["steps"]), default=0) / MIB
        self.say(f"#   {config} at {batch}: {state}, peak {peak:.0f} MiB")
        return r

    def largest(self, model: str, config: str, cap: int) -> tuple[int, dict | None]:
        base = self.args.base_batch
        lo, hi, best = 0, None, None
        b = base
        while hi is None:
            r = self.probe(model, config, b, self.args.search_steps, cap)
            if r["ok"]:
                lo, best = b, r
                if b >= self.args.max_batch:
                    break
                b = min(b * 2, self.args.max_batch)
            else:
                hi = b
        while hi is not None and hi - lo > max(1, lo // 16):
            mid = (lo + hi) // 2
            r = self.probe(model, config, mid, self.args.search_steps, cap)
            if r["ok"]:
                lo, best = mid, r
            else:
                hi = mid
        if lo == 0:
            return 0, None
        # The largest found, run long: tokens/s and whether memory stays flat. A run that
        # does not hold up over the longer run steps down.
        for _ in range(4):
            r = self.probe(model, config, lo, self.args.steps, cap)
            if r["ok"]:
                return lo, r
            lo -= max(1, lo // 16)
            if lo < 1:
                break
        return 0, best

    def model(self, model: str) -> None:
        a = self.args
        m = MODELS[model]
        base = a.base_batch
        self.say()
        self.say(
            f"## {model}: {m['layers']} layers, d_model {m['d']}, {m['seq']} tokens a sequence; "
            f"one layer saves {self.footprints[model] / MIB:.2f} MiB a sequence"
        )
        at_base = run(self.spec(model, "none", base, 3), self.cgroups, None, a.timeout)
        over = run(self.spec(model, "none", base + 1, 3), self.cgroups, None, a.timeout)
        if not (at_base["ok"] and over["ok"]):
            raise SystemExit(f"no offload did not run: {at_base['why'] or over['why']}")
        p0, p1 = at_base["steps"][-1]["peak"], over["steps"][-1]["peak"]
        cap = (p0 + p1) // 2
        self.say(
            f"# cap {cap / MIB:.0f} MiB: halfway between no offload's peak at {base} sequences "
            f"({p0 / MIB:.0f} MiB) and at {base + 1} ({p1 / MIB:.0f} MiB)"
        )
        rows = {}
        for config in [] if a.skip_largest else a.configs:
            self.say(f"# largest batch: {config}")
            batch, r = self.largest(model, config, cap)
            rows[config] = {"batch": batch, "run": r}
        none = rows.get("none", {})
        none_tps = base * m["seq"] / step_time(none["run"]) if none.get("run") else None
        self.say()
        self.say(
            f"| {model}, cap {cap / MIB:.0f} MiB | largest batch | vs no offload | tokens/s "
            "| vs no offload | peak MiB (last step) | flat over the steps "
            "| GB to / from the disk a step |"
        )
        self.say("|---|---:|---:|---:|---:|---:|---|---|")
        for config, row in rows.items():
            r = row["run"]
            if not r or not row["batch"]:
                self.say(f"| {config} | none found | - | - | - | - | - | - |")
                continue
            tps = row["batch"] * m["seq"] / step_time(r)
            is_flat, grow = flat(r)
            row.update(tokens_s=tps, flat=is_flat, growth_mib=grow)
            last = r["steps"][-1]
            moved = disk_bytes(last)
            self.say(
                f"| {config} | {row['batch']} | {row['batch'] / base:.1f}x | {tps:.0f} "
                f"| {tps / none_tps:.2f}x | {last['peak'] / MIB:.0f} "
                f"| {'yes' if is_flat else 'no'} ({grow:+.0f} MiB) | {moved} |"
                if none_tps
                else f"| {config} | {row['batch']} | - | {tps:.0f} | - | - | - | {moved} |"
            )
        equal = self.equal_batch(model, cap)
        at_ratio = self.at_ratio(model, cap) if a.at_ratio else None
        self.report["models"][model] = {
            "cap": cap,
            "largest": {c: {k: v for k, v in row.items()} for c, row in rows.items()},
            "equal_batch": equal,
            "at_ratio": at_ratio,
        }

    def at_ratio(self, model: str, cap: int) -> dict:
        a = self.args
        base, seq = a.base_batch, MODELS[model]["seq"]
        batch = int(round(a.at_ratio * base))
        names = list(a.configs) + ([NO_CAP] if a.uncapped_reference else [])
        results: dict[str, list[dict]] = {c: [] for c in names}
        for _, order in interleaved(names, a.rounds, seed=11):
            for name in order:
                if name == NO_CAP:
                    spec, limit = self.spec(model, "none", batch, a.steps), None
                else:
                    b = base if name == "none" else batch
                    spec, limit = self.spec(model, name, b, a.steps), cap
                results[name].append(run(spec, self.cgroups, limit, a.timeout))

        def tokens_s(name: str, r: dict) -> float:
            return (base if name == "none" else batch) * seq / step_time(r)

        def ratios(name: str, against: str) -> list[float]:
            return [
                tokens_s(name, r) / tokens_s(against, n)
                for r, n in zip(results[name], results[against], strict=True)
                if r["ok"] and n["ok"]
            ]

        def span(xs: list[float]) -> str:
            return f"{med(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})" if xs else "-"

        reference = NO_CAP in results
        self.say()
        self.say(
            f"| {model} at {batch} sequences ({a.at_ratio:g}x no offload's {base}), "
            f"{a.rounds} rounds | tokens/s | vs no offload (same round) "
            + ("| vs no offload at this batch without a cap (same round) " if reference else "")
            + "| peak MiB | GB to / from the disk a step | steal s a step |"
        )
        self.say("|---|---:|---:|" + ("---:|" if reference else "") + "---:|---|---:|")
        out = {}
        for name, rs in results.items():
            ok = [r for r in rs if r["ok"]]
            if not ok:
                self.say(f"| {name} | {rs[0]['why']} |" + " - |" * (5 if reference else 4))
                continue
            tps = med(tokens_s(name, r) for r in ok)
            against_none = ratios(name, "none")
            last = ok[0]["steps"][-1]
            moved = disk_bytes(last)
            peak = med(r["steps"][-1]["peak"] for r in ok) / MIB
            steal = med(steal_time(r) for r in ok)
            out[name] = {
                "batch": base if name == "none" else batch,
                "tokens_s": tps,
                "ratios": against_none,
                "peak": peak,
                "steal_s": steal,
                "runs": rs,
            }
            cells = [f"{tps:.0f}", span(against_none)]
            if reference:
                against_free = ratios(name, NO_CAP) if name != "none" else []
                out[name]["ratios_no_cap"] = against_free
                cells.append(span(against_free))
            cells += [f"{peak:.0f}", moved, f"{steal:.2f}"]
            self.say(f"| {name} | " + " | ".join(cells) + " |")
        return out

    def equal_batch(self, model: str, cap: int) -> dict:
        a = self.args
        base = a.base_batch
        results: dict[str, list[dict]] = {c: [] for c in a.configs}
        for _, order in interleaved(a.configs, a.rounds, seed=7):
            for config in order:
                spec = self.spec(model, config, base, a.steps, a.equal_budget_layers)
                results[config].append(run(spec, self.cgroups, cap, a.timeout))
        self.say()
        self.say(
            f"| {model} at {base} sequences (no offload's largest), {a.rounds} rounds, budget "
            f"{a.budget_layers if a.equal_budget_layers is None else a.equal_budget_layers:g} "
            "layer(s) "
            "| step s | vs no offload | peak MiB | flat over the steps | compute/I/O a layer "
            "| GB to / from the disk a step | steal s a step |"
        )
        self.say("|---|---:|---:|---:|---|---:|---|---:|")
        out = {}
        for config, rs in results.items():
            ok = [r for r in rs if r["ok"]]
            if not ok:
                self.say(f"| {config} | {rs[0]['why']} | - | - | - | - | - | - |")
                continue
            t = med(step_time(r) for r in ok)
            ratios = [
                step_time(r) / step_time(n)
                for r, n in zip(rs, results["none"], strict=True)
                if r["ok"] and n["ok"]
            ]
            ratio = f"{med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"
            peak = med(r["steps"][-1]["peak"] for r in ok) / MIB
            balance = "-"
            last = ok[0]["steps"][-1]
            if "written" in last and last["write_s"] > 0 and last["read_s"] > 0:
                none_t = med(step_time(r) for r in results["none"] if r["ok"])
                io = (
                    med(r["steps"][-1]["write_s"] + r["steps"][-1]["read_s"] for r in ok)
                    / a.io_threads
                )
                balance = f"{none_t / max(io, 1e-9):.1f}"
            flats = [flat(r) for r in ok]
            is_flat = all(f for f, _ in flats)
            grow = max(g for _, g in flats)
            moved = disk_bytes(last)
            steal = med(steal_time(r) for r in ok)
            out[config] = {
                "time": t,
                "ratios": ratios,
                "peak": peak,
                "flat": is_flat,
                "steal_s": steal,
                "runs": rs,
            }
            self.say(
                f"| {config} | {t:.3f} | {ratio} | {peak:.0f} "
                f"| {'yes' if is_flat else 'no'} ({grow:+.0f} MiB) | {balance} | {moved} "
                f"| {steal:.2f} |"
            )
        return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="deep,shallow")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--steps", type=int, default=8, help="steps of a long run")
    ap.add_argument("--search-steps", type=int, default=3, help="steps of a search probe")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the equal-batch runs")
    ap.add_argument("--base-batch", type=int, default=4, help="no offload's largest batch")
    ap.add_argument("--max-batch", type=int, default=512)
    ap.add_argument("--budget-layers", type=float, default=1.0, help="offload budget in layers")
    ap.add_argument(
        "--equal-budget-layers",
        type=float,
        default=None,
        help="offload budget in layers at equal batch (default: --budget-layers)",
    )
    ap.add_argument(
        "--skip-largest", action="store_true", help="only the cap and the equal-batch runs"
    )
    ap.add_argument(
        "--at-ratio",
        type=float,
        default=None,
        help="also run the offload configurations at this many times no offload's batch",
    )
    ap.add_argument(
        "--uncapped-reference",
        action="store_true",
        help="with --at-ratio, also run no offload at that batch without a cap (needs the "
        "memory: the cost of offload itself at that batch)",
    )
    ap.add_argument("--io-threads", type=int, default=2, help="offload's I/O threads (default)")
    ap.add_argument("--threads", type=int, default=None, help="torch's compute threads")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    ap.add_argument("--dir", default=None, help="swap directory (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    ap.add_argument("--out", default=None, help="also write the tables to this file")
    ap.add_argument(
        "--quick", action="store_true", help="the tiny model, 4 steps, 1 round: a smoke run"
    )
    args = ap.parse_args()
    if args.quick:
        args.models, args.steps, args.search_steps, args.rounds = "tiny", 4, 2, 1
        args.max_batch = min(args.max_batch, 64)
    args.models = [m for m in args.models.split(",") if m]
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = set(args.configs) - set(CONFIGS + OPTIONAL_CONFIGS)
    if unknown:
        ap.error(f"unknown configurations {sorted(unknown)}: {CONFIGS + OPTIONAL_CONFIGS}")
    if "none" not in args.configs:
        args.configs.insert(0, "none")

    import fastensor.torch  # noqa: F401 (its pages charged here, not to the runs)
    import torch

    tmp = tempfile.TemporaryDirectory(dir=args.dir or os.environ.get("FASTENSOR_OFFLOAD_DIR"))
    args.dir = tmp.name
    bench = Bench(args)
    bench.report["args"] = {k: v for k, v in vars(args).items() if k != "dir"}
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        here = os.path.dirname(os.path.abspath(__file__))
        git = ["git", "-C", here, "rev-parse", "HEAD"]
        bench.report["commit"] = subprocess.run(
            git, capture_output=True, text=True, check=True
        ).stdout.strip()
    bench.footprints = {m: footprint(MODELS[m]) for m in args.models}
    bench.say(
        f"# fastensor offload under a memory cgroup ({'v2' if bench.cgroups.v2 else 'v1'}): "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; swap dir {args.dir}; "
        f"{args.steps} steps a long run, {args.search_steps} a probe; offload budget "
        f"{args.budget_layers} layer(s) of activations"
    )
    for model in args.models:
        bench.model(model)
    if args.json:
        Path(args.json).write_text(json.dumps(bench.report, indent=1, default=str))
    write_report(Path(args.out) if args.out else None, "\n".join(bench.lines) + "\n")
    tmp.cleanup()


if __name__ == "__main__":
    main()
