"""Fresh-process checkpoint benchmark: every load and save as a user's script runs it.

Each subject runs in a process of its own (modules imported and warmed before the clock
starts), the page cache of the checkpoint files dropped before it (``sync`` and
``/proc/sys/vm/drop_caches`` where permitted, else ``POSIX_FADV_DONTNEED`` on the files,
which the report says), and every page of every loaded tensor touched inside the timed
region. Rounds are interleaved: each round runs every subject once in a shuffled order,
and fastensor's ratio to each anchor is taken within the round; the report gives the
median ratio with its range and every raw time.

The checkpoint is GPT-2-medium-shaped (292 f32 tensors, about 1.42 GB at ``--scale 1``).

    python fastensor-python/bench/fresh.py [--dir DIR] [--rounds 5] [--scale 1.0]
        [--out docs/lab/runs/fresh-DATE.md] [--only load|save]

Anchors that are not installed (fastsafetensors, runai-model-streamer) are left out, and
the report says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _util  # the bench's own helpers, beside this file
from _util import drop_caches, durable, fmt_ratio, interleaved, subjects, touch, write_report

HERE = Path(__file__).resolve().parent

# name -> (kind, description)
SUBJECTS = subjects(
    load={
        "fastensor.load_file": "fastensor.torch.load_file",
        "fastensor.load_file(st file)": "fastensor.torch.load_file of the file safetensors wrote",
        "safetensors.load_file": "safetensors.torch.load_file",
        "torch.load(mmap)": "torch.load(mmap=True, weights_only=True)",
        "torch.load": "torch.load(weights_only=True)",
        "fastsafetensors": "fastsafetensors fastsafe_open(nogds=True), CPU",
        "runai": "runai_model_streamer SafetensorsStreamer, CPU",
        "raw O_DIRECT": "4 threads reading the file with O_DIRECT into 64 MiB buffers"
        " faulted in first",
        "fastensor.load_file(verify)": "fastensor.torch.load_file(verify=True) of a file saved"
        " with checksum=True",
    },
    into={
        "fastensor.load_into": "fastensor.torch.load_into(existing model)",
        "safetensors+copy_": "safetensors load_file + model.load_state_dict",
    },
    save={
        "fastensor.save_file": "fastensor.torch.save_file (durable)",
        "fastensor.save_file(checksum)": "fastensor.torch.save_file(checksum=True)",
        "safetensors.save_file": "safetensors.torch.save_file + fsync",
        "torch.save": "torch.save + fsync",
    },
)

# fastensor subject -> the anchors it is compared with, per kind
COMPARE = {
    "fastensor.load_file": [
        "safetensors.load_file",
        "torch.load(mmap)",
        "torch.load",
        "fastsafetensors",
        "runai",
        "raw O_DIRECT",
    ],
    "fastensor.load_file(st file)": ["safetensors.load_file"],
    "fastensor.load_into": ["safetensors+copy_"],
    "fastensor.save_file": ["safetensors.save_file", "torch.save"],
}


# fastensor subject with an option -> the same without it (the option's cost)
OVERHEAD = {
    "fastensor.load_file(verify)": "fastensor.load_file",
    "fastensor.save_file(checksum)": "fastensor.save_file",
}


def available(subject: str) -> bool:
    mod = {"fastsafetensors": "fastsafetensors", "runai": "runai_model_streamer"}.get(subject)
    if mod is None:
        return True
    import importlib.util

    return importlib.util.find_spec(mod) is not None


# ---------------------------------------------------------------- the child process


def child(subject: str, files: dict[str, str], scale: float) -> dict:
    """Runs one subject in this (fresh) process; returns its timings."""
    import torch

    sys.path.insert(0, str(HERE))
    from checkpoint import Model, gpt2_medium, gpt2_medium_shapes

    touch([torch.zeros(1 << 16)])  # touch's own kernels loaded before the clock starts
    kind = SUBJECTS[subject][0]
    if kind == "save":
        return child_save(subject, files, scale, gpt2_medium)
    model = None
    if kind == "into":
        model = Model(gpt2_medium_shapes(scale))
        for p in model.parameters():
            p.data.fill_(1.0)  # an existing model's memory, faulted in
    load = loader(subject, files, model)
    t0 = time.perf_counter()
    result = load()
    if isinstance(result, dict):
        touch(result.values())
    elapsed = time.perf_counter() - t0
    usage = os.times()
    return {"seconds": elapsed, "user": usage.user, "sys": usage.system}


def loader(subject: str, files: dict[str, str], model):
    """The subject's load, returning what it loaded (a dict is touched afterwards)."""
    import torch

    if subject.startswith("fastensor"):
        import fastensor.torch as ft

        if subject == "fastensor.load_file":
            return lambda: ft.load_file(files["ours"])
        if subject == "fastensor.load_file(st file)":
            return lambda: ft.load_file(files["st"])
        if subject == "fastensor.load_file(verify)":
            return lambda: ft.load_file(files["checked"], verify=True)
        if subject == "fastensor.load_into":

            def into():
                ft.load_into(model, files["ours"])
                return dict(model.state_dict())

            return into
    if subject == "safetensors.load_file":
        import safetensors.torch as st

        return lambda: st.load_file(files["st"])
    if subject == "safetensors+copy_":
        import safetensors.torch as st

        def copy():
            model.load_state_dict(st.load_file(files["st"]))
            return dict(model.state_dict())

        return copy
    if subject == "torch.load(mmap)":
        return lambda: torch.load(files["pt"], mmap=True, weights_only=True)
    if subject == "torch.load":
        return lambda: torch.load(files["pt"], weights_only=True)
    if subject == "fastsafetensors":
        from fastsafetensors import fastsafe_open

        def fss():

            with fastsafe_open(filenames=[files["st"]], nogds=True, device="cpu") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no __iter__)
                touch(tensors.values())  # inside: the tensors live in its buffer
            return None

        return fss
    if subject == "runai":
        from runai_model_streamer import SafetensorsStreamer

        def runai():
            out = {}
            with SafetensorsStreamer() as s:
                s.stream_file(files["st"])
                for name, tensor in s.get_tensors():
                    out[name] = tensor
            return out

        return runai
    if subject == "raw O_DIRECT":
        return raw_direct(files["ours"])
    raise SystemExit(f"unknown subject {subject}")


def raw_direct(path: str):
    """The device's limit: the file read with O_DIRECT by 4 threads, each into its own
    64 MiB buffer, faulted in before the clock starts and reused (nothing is kept)."""
    import mmap
    import threading

    chunk = 64 << 20
    bufs = []
    for _ in range(4):
        buf = mmap.mmap(-1, chunk)
        buf.write(b"\1" * chunk)
        bufs.append(buf)

    def read() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            starts = iter(range(0, os.fstat(fd).st_size, chunk))
            lock = threading.Lock()

            def work(buf):
                while True:
                    with lock:
                        at = next(starts, None)
                    if at is None:
                        return
                    os.preadv(fd, [buf], at)

            threads = [threading.Thread(target=work, args=(b,)) for b in bufs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            os.close(fd)

    return read


def child_save(subject: str, files: dict[str, str], scale: float, gpt2_medium) -> dict:
    import torch

    sd = gpt2_medium(scale)
    out = files["out"]
    t0 = time.perf_counter()
    if subject.startswith("fastensor.save_file"):
        import fastensor.torch as ft

        ft.save_file(sd, out, checksum=subject.endswith("(checksum)"))
    elif subject == "safetensors.save_file":
        import safetensors.torch as st

        st.save_file(sd, out)
        durable(out)
    elif subject == "torch.save":
        torch.save(sd, out)
        durable(out)
    elapsed = time.perf_counter() - t0
    usage = os.times()
    os.unlink(out)
    return {"seconds": elapsed, "user": usage.user, "sys": usage.system}


# ---------------------------------------------------------------- the driver


def run_child(subject: str, files: dict[str, str], scale: float) -> dict:
    cmd = [sys.executable, __file__, "--child", subject, "--files", json.dumps(files)]
    cmd += ["--scale", str(scale)]
    env = dict(os.environ, FASTENSOR_PROFILE="")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{subject} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def prepare(base: Path, scale: float) -> dict[str, str]:
    import fastensor.torch as ft
    import safetensors.torch as st
    import torch

    sys.path.insert(0, str(HERE))
    from checkpoint import gpt2_medium

    files = {
        "ours": str(base / "ours.safetensors"),
        "st": str(base / "st.safetensors"),
        "pt": str(base / "torch.pt"),
        "checked": str(base / "checked.safetensors"),
        "out": str(base / "out.bin"),
    }
    sd = gpt2_medium(scale)
    ft.save_file(sd, files["ours"])
    ft.save_file(sd, files["checked"], checksum=True)
    st.save_file(sd, files["st"])
    torch.save(sd, files["pt"])
    for k in ("st", "pt"):
        durable(files[k])
    return files


def report(times: dict[str, list[float]], args, cache_note: str, missing: list[str]) -> str:
    lines = [
        f"Fresh process per subject, {args.rounds} interleaved rounds, scale {args.scale}; "
        f"page cache: {cache_note}.",
        "",
        "| fastensor | vs | median ratio (range), > 1: fastensor faster |",
        "|---|---|---|",
    ]
    for ours, anchors in COMPARE.items():
        if ours not in times:
            continue
        for anchor in anchors:
            if anchor not in times:
                continue
            ratios = [a / o for o, a in zip(times[ours], times[anchor], strict=True)]
            lines.append(f"| {ours} | {SUBJECTS[anchor][1]} | {fmt_ratio(ratios)} |")
    overheads = [(o, b) for o, b in OVERHEAD.items() if o in times and b in times]
    if overheads:
        lines += ["", "| option | its cost: median of per-round (with / without - 1) (range) |"]
        lines += ["|---|---|"]
        for with_, without in overheads:
            costs = [w / o - 1 for w, o in zip(times[with_], times[without], strict=True)]
            lines.append(
                f"| {SUBJECTS[with_][1]} | **{statistics.median(costs):+.1%}** "
                f"({min(costs):+.1%} to {max(costs):+.1%}) |"
            )
    lines += [
        "",
        "| subject | median s | min s | max s | every round (s) |",
        "|---|---|---|---|---|",
    ]
    for name, values in times.items():
        raw = ", ".join(f"{v:.3f}" for v in values)
        lines.append(
            f"| {SUBJECTS[name][1]} | {statistics.median(values):.3f} | {min(values):.3f} "
            f"| {max(values):.3f} | {raw} |"
        )
    if missing:
        lines += ["", "Not installed, left out: " + ", ".join(missing) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="shrink the matrices (quick runs)")
    ap.add_argument("--only", choices=["load", "save"], default=None)
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--files", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.files), args.scale)))
        return
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    base = _util.scratch("fastensor-fresh-", args.dir)
    files = prepare(base, args.scale)
    kinds = {"load": {"load", "into"}, "save": {"save"}, None: {"load", "into", "save"}}
    subjects = [s for s, (k, _) in SUBJECTS.items() if k in kinds[args.only]]
    missing = [SUBJECTS[s][1] for s in subjects if not available(s)]
    subjects = [s for s in subjects if available(s)]
    times: dict[str, list[float]] = {s: [] for s in subjects}
    cache_note = ""
    for r, order in interleaved(subjects, args.rounds, args.seed):
        for s in order:
            cache_note = drop_caches([files[k] for k in ("ours", "st", "pt", "checked")])
            time.sleep(0.2)
            t = run_child(s, files, args.scale)
            times[s].append(t["seconds"])
            print(
                f"round {r + 1} {s}: {t['seconds']:.3f} s (user {t['user']:.2f}, "
                f"sys {t['sys']:.2f})",
                flush=True,
            )
    text = report(times, args, cache_note, missing)
    print(text)
    write_report(args.out, text)
    for p in base.iterdir():
        p.unlink()
    base.rmdir()


if __name__ == "__main__":
    main()
