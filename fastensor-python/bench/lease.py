"""What protecting mapped loads costs: fresh-process ``load_file`` with its read lease,
the fallbacks where no lease can be had, and the time a lease break holds a writer.

For each checkpoint size, every round runs in fresh processes, the file's page cache
dropped before each (``POSIX_FADV_DONTNEED`` on the file), every page of every tensor
touched inside the timed region:

* ``leased``: ``load_file`` as it runs by default (mapped under a read lease);
* ``read (no lease)``: the same while another process holds the file open for writing, so
  no lease can be had and the load reads the file into memory of its own (the default
  fallback);
* ``unprotected (no lease)``: the same with ``Engine(unprotected_maps=True)``: mapped
  anyway, unprotected (the opt-in fallback);
* ``break``: a process holds the loaded tensors; another opens the file for writing; the
  time its ``open`` waits is the break's cost (the lease thread moves every loaded byte
  into memory of the holder);
* ``break, paged out``: the same after the holder's pages were reclaimed
  (``MADV_PAGEOUT``) and the file's page cache dropped: the move reads the file again.

    python fastensor-python/bench/lease.py [--dir DIR] [--sizes 1,2,4] [--rounds 3]
        [--out FILE]

Results of runs: docs/lab/leases.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _util
from _util import drop_file_cache, touch, write_report

SUBJECTS = ["leased", "read (no lease)", "unprotected (no lease)", "break", "break, paged out"]
TENSOR = 64 << 20  # bytes per tensor


def make(path: Path, gb: float) -> None:
    import fastensor.torch as ft
    import torch

    n = max(1, int(gb * (1 << 30)) // TENSOR)
    ft.save_file({f"t{i}": torch.full((TENSOR // 4,), float(i)) for i in range(n)}, path)


def rss_anon() -> int:
    """Bytes of anonymous memory this process holds (``RssAnon``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def page_out(tensors) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for t in tensors:
        start = t.data_ptr() // 4096 * 4096
        end = t.data_ptr() + t.numel() * t.element_size()
        libc.madvise(start, end - start, 21)  # MADV_PAGEOUT


def worker(spec: dict) -> None:
    import fastensor
    import fastensor.torch as ft
    from fastensor import _native

    engine = fastensor.Engine(unprotected_maps=spec["subject"].startswith("unprotected"))
    path = spec["path"]
    started = time.perf_counter()
    tensors = ft.load_file(path, engine=engine)
    touch(tensors.values())
    took = time.perf_counter() - started
    placement = engine._native.load_new(path, ["t0"])[2]
    out = {"load_s": took, "placement": placement}
    if spec["subject"].startswith("break"):
        if "paged out" in spec["subject"]:
            page_out(tensors.values())
            drop_file_cache([path])
        out["anon_before"] = rss_anon()
        print(json.dumps(out), flush=True)
        sys.stdin.readline()
        out["anon_after"] = rss_anon()
        out["stats"] = _native.lease_stats()
        out["intact"] = all(float(t[-1]) == float(i) for i, t in enumerate(tensors.values()))
    print(json.dumps(out), flush=True)


def run(subject: str, path: Path) -> dict:
    drop_file_cache([path])
    spec = json.dumps({"subject": subject, "path": str(path)})
    cmd = [sys.executable, __file__, "--worker", spec]
    writer = None
    if "no lease" in subject:
        writer = os.open(path, os.O_WRONLY)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = json.loads(proc.stdout.readline())
        if not subject.startswith("break"):
            proc.wait()
            return first
        started = time.perf_counter()
        fd = os.open(path, os.O_WRONLY)
        held = time.perf_counter() - started
        os.close(fd)
        out, _ = proc.communicate("go\n")
        result = {**first, **json.loads(out), "writer_held_s": held}
        return result
    finally:
        if writer is not None:
            os.close(writer)


def spread(values: list[float], digits: int = 3) -> str:
    """The median and every value, or ``-`` for none."""
    if not values:
        return "-"
    every = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{statistics.median(values):.{digits}f} ({every})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--dir")
    ap.add_argument("--sizes", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    os.environ["FASTENSOR_PROFILE"] = ""
    work = _util.scratch("fastensor-lease-", args.dir)
    lines = [
        "| size | subject | placement | load s (median, every round) | writer held s |"
        " moved GB/s | anon MB before -> after |",
        "|---|---|---|---|---|---|---|",
    ]
    raw = []
    for gb in [float(s) for s in args.sizes.split(",")]:
        path = work / f"m{gb:g}.safetensors"
        make(path, gb)
        size = path.stat().st_size
        results: dict[str, list[dict]] = {s: [] for s in SUBJECTS}
        for r, order in _util.interleaved(SUBJECTS, args.rounds, seed=int(gb * 10)):
            for subject in order:
                res = run(subject, path)
                results[subject].append(res)
                raw.append({"gb": gb, "round": r, "subject": subject, **res})
                print(json.dumps(raw[-1]), file=sys.stderr, flush=True)
        for subject in SUBJECTS:
            rs = results[subject]
            loads = [x["load_s"] for x in rs]
            held = [x["writer_held_s"] for x in rs if "writer_held_s" in x]
            moved = [
                x["stats"]["bytes_moved"] / x["stats"]["longest_held"] / 1e9
                for x in rs
                if x.get("stats", {}).get("longest_held")
            ]
            anon = [
                f"{x['anon_before'] >> 20} -> {x['anon_after'] >> 20}"
                for x in rs
                if "anon_after" in x
            ]
            assert all(x.get("intact", True) for x in rs), subject
            lines.append(
                f"| {size / 1e9:.2f} GB | {subject} | {rs[0]['placement']} | {spread(loads)} | "
                f"{spread(held)} | {spread(moved, 2)} | {'; '.join(anon) or '-'} |"
            )
        path.unlink()
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_report(args.out, text + "\n\nRaw: " + json.dumps(raw) + "\n")


if __name__ == "__main__":
    main()
