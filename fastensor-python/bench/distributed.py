"""Loads by the ranks of a process group: the time until every rank holds every tensor, and
the bytes the source served, in fresh processes (gloo on the CPU, N ranks on this host).

Sources: the checkpoint on local disk (page cache dropped before each load), on the local
S3 server (fastensor-s3-server on the loopback interface), and on that server limited to a
network-like bandwidth for all clients together (``--bandwidth``, default 200 MB/s: the case
of a cluster whose storage is the bottleneck).

Subjects (each load a fresh set of N processes, rounds interleaved):

- ``fastensor group``: ``load_file(path, process_group=WORLD)``, the way chosen by the
  engine (its profile kept across the run's loads, in a scratch file: the warm-up rounds,
  reported apart, are where it explores);
- ``fastensor group broadcast`` / ``fastensor group each``: the same, the way forced;
- ``fastensor each rank``: ``load_file(path)`` on every rank, no group;
- ``safetensors each rank``: ``safetensors.torch.load_file`` on every rank (local only);
- ``fastsafetensors group``: ``SafeTensorsFileLoader(pg, "cpu", nogds=True)``, the file
  given to rank 0, every tensor broadcast (``as_dict`` with dim -1; local only).

Every loaded tensor's pages are touched on every rank before the clock stops. Ratios are
per round: the subject's time over ``fastensor group``'s.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
import _util  # noqa: E402
from _util import drop_caches, fmt_ratio, interleaved, write_report  # noqa: E402

BUCKET = "ckpt"
KEY = "dist/model.safetensors"

SUBJECTS = {
    "fastensor group": "load_file(process_group=WORLD), the way the engine chose",
    "fastensor group broadcast": "load_file(process_group=WORLD, group_read='broadcast')",
    "fastensor group each": "load_file(process_group=WORLD, group_read='each')",
    "fastensor each rank": "load_file on every rank, no group",
    "safetensors each rank": "safetensors.torch.load_file on every rank",
    "fastsafetensors group": "SafeTensorsFileLoader(pg, 'cpu', nogds=True), as_dict(dim -1)",
}
LOCAL_ONLY = {"safetensors each rank", "fastsafetensors group"}


def state_dict(gb: float):
    """A checkpoint of about ``gb`` GB: transformer-like layers of several sizes."""
    import torch

    g = torch.Generator().manual_seed(3)
    out, total, i = {}, 0, 0
    while total < gb * 1e9:
        for name, shape in (("qkv", (1024, 3072)), ("o", (1024, 1024)), ("ln", (1024,))):
            t = torch.randn(shape, generator=g)
            out[f"layer.{i}.{name}"] = t
            total += t.numel() * 4
        i += 1
    return out


# --- one rank -------------------------------------------------------------------------


def rank_main(subject: str, location: str) -> None:
    """One rank of one load: init, barrier, load, touch, barrier; rank 0 prints the time."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # The libraries are imported before the clock starts, as a program imports them first.
    if subject.startswith("fastensor"):
        import fastensor.torch as ft
    elif subject == "safetensors each rank":
        from safetensors.torch import load_file
    elif subject == "fastsafetensors group":
        from collections import OrderedDict

        from fastsafetensors import SafeTensorsFileLoader
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pg = dist.group.WORLD
    dist.barrier()
    t0 = time.perf_counter()
    keep = None
    if subject.startswith("fastensor group"):
        way = {"fastensor group": None}.get(subject, subject.rsplit(" ", 1)[-1])
        sd = ft.load_file(location, process_group=pg, group_read=way)
    elif subject == "fastensor each rank":
        sd = ft.load_file(location)
    elif subject == "safetensors each rank":
        sd = load_file(location)
    elif subject == "fastsafetensors group":
        loader = SafeTensorsFileLoader(pg, "cpu", nogds=True)
        loader.add_filenames({0: [location]})
        fb = loader.copy_files_to_device()
        names = list(fb.key_to_rank_lidx)
        sd = {
            k: v.get_raw() if hasattr(v, "get_raw") else v
            for k, v in fb.as_dict(OrderedDict((k, -1) for k in names)).items()
        }
        keep = (fb, loader)
    else:
        raise SystemExit(f"unknown subject {subject}")
    _util.touch(sd.values())
    dist.barrier()
    seconds = time.perf_counter() - t0
    if keep is not None:
        keep[0].close()
        keep[1].close()
    if rank == 0:
        way = getattr(sys.modules.get("fastensor._group"), "last_way", None)
        print(json.dumps({"seconds": seconds, "way": way}), flush=True)
    dist.destroy_process_group()


# --- the driver -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_load(subject: str, location: str, ranks: int, env: dict[str, str]) -> dict:
    """One load by ``ranks`` fresh processes; rank 0's report."""
    port = free_port()
    procs = []
    for r in range(ranks):
        e = dict(env, RANK=str(r), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1")
        e.update(LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks))  # as torchrun sets them
        e["MASTER_PORT"] = str(port)
        cmd = [sys.executable, __file__, "--rank-of", subject, "--location", location]
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"{subject} on {ranks} ranks failed:\n{err.decode()[-3000:]}")
    return json.loads(outs[0][0].decode().strip().splitlines()[-1])


class Server:
    def __init__(self, binary: str, root: Path, bandwidth: int | None):
        (root / BUCKET).mkdir(parents=True, exist_ok=True)
        cmd = [binary, "--root", str(root), "--listen", "127.0.0.1:0"]
        if bandwidth:
            cmd += ["--bandwidth", str(bandwidth)]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        self.root = root

    def _call(self, method: str) -> dict:
        conn = http.client.HTTPConnection(self.url.removeprefix("http://"), timeout=10)
        conn.request(method, "/_faults")
        body = conn.getresponse().read()
        return json.loads(body) if body else {}

    def reset(self) -> None:
        self._call("DELETE")

    def sent(self) -> int:
        return int(self._call("GET")["sent_bytes"])

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "fastensor",
            "AWS_SECRET_ACCESS_KEY": "fastensor-secret",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def report(results: dict, args, size: int, cache: str, missing: list[str]) -> str:
    lines = [
        f"Process-group loads of a {size / 1e9:.2f} GB checkpoint (fp32, transformer-shaped), gloo"
        f" on the CPU, every rank on this host; {args.rounds} rounds after {args.warmup}"
        f" warm-up load(s) per source and size, fresh processes per load, page cache {cache}.",
        f"Throttled: the S3 server paced to {args.bandwidth / 1e6:.0f} MB/s for all clients.",
        "",
        "| source | ranks | subject | median s | served / checkpoint | ratio to fastensor group"
        " (per round) | ways taken |",
        "|---|---|---|---|---|---|---|",
    ]
    for (source, n), by_subject in results.items():
        ours = by_subject.get("fastensor group")
        for name, runs in by_subject.items():
            ts = [r["seconds"] for r in runs]
            served = [r.get("served") for r in runs if r.get("served") is not None]
            sv = f"{statistics.median(served) / size:.2f}" if served else "-"
            ratio = (
                ""
                if name == "fastensor group" or not ours
                else fmt_ratio(
                    [r["seconds"] / o["seconds"] for r, o in zip(runs, ours, strict=True)]
                )
            )
            ways = ",".join(sorted({str(r.get("way")) for r in runs if r.get("way")})) or ""
            med = statistics.median(ts)
            lines.append(f"| {source} | {n} | {name} | {med:.3f} | {sv} | {ratio} | {ways} |")
    lines += ["", "Raw times (s):", ""]
    for (source, n), by_subject in results.items():
        for name, runs in by_subject.items():
            lines.append(
                f"- {source}, {n} ranks, {name}: " + ", ".join(f"{r['seconds']:.3f}" for r in runs)
            )
    if missing:
        lines += ["", f"Not installed, left out: {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=4, help="auto loads per context before timing")
    ap.add_argument("--gb", type=float, default=0.5, help="checkpoint size")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--bandwidth", type=int, default=200_000_000)
    ap.add_argument("--sources", default="local,s3,s3-throttled")
    ap.add_argument("--server", default=os.environ.get("FASTENSOR_S3_SERVER"))
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rank-of", default=None)
    ap.add_argument("--location", default=None)
    ap.add_argument("--upload", default=None, help="(internal) a file to save to --location")
    args = ap.parse_args()
    if args.rank_of:
        rank_main(args.rank_of, args.location)
        return
    if args.upload:
        import fastensor.torch as ft

        ft.save_file(ft.load_file(args.upload), args.location)  # through the server: its ETag
        return
    sources = args.sources.split(",")
    if any(s.startswith("s3") for s in sources) and not args.server:
        raise SystemExit("--server (or FASTENSOR_S3_SERVER) is needed for the s3 sources")
    root = _util.scratch("fastensor-dist-", args.dir)
    profile = root / "profile.toml"
    servers: dict[str, Server] = {}
    try:
        import fastensor.torch as ft

        sd = state_dict(args.gb)
        local = str(root / "model.safetensors")
        ft.save_file(sd, local)
        size = os.path.getsize(local)
        base_env = dict(os.environ, FASTENSOR_PROFILE=str(profile), OMP_NUM_THREADS="1")
        locations: dict[str, tuple[str, dict[str, str]]] = {}
        if "local" in sources:
            locations["local"] = (local, base_env)
        for s in ("s3", "s3-throttled"):
            if s in sources:
                srv = Server(args.server, root / s, args.bandwidth if s == "s3-throttled" else None)
                servers[s] = srv
                env = dict(base_env, **srv.env())
                url = f"s3://{BUCKET}/{KEY}"
                up = [sys.executable, __file__, "--upload", local, "--location", url]
                subprocess.run(up, env=env, check=True)  # (a process per server: its client)
                locations[s] = (f"s3://{BUCKET}/{KEY}", env)
        del sd
        missing = [m for m in ("fastsafetensors",) if not _importable(m)]
        results: dict = {}
        cache = ""
        for n in [int(x) for x in args.ranks.split(",")]:
            for source, (location, env) in locations.items():
                names = [s for s in SUBJECTS if not (source != "local" and s in LOCAL_ONLY)]
                names = [s for s in names if not (s == "fastsafetensors group" and missing)]
                for _ in range(args.warmup):  # the engine explores here
                    cache = drop_caches(_util.files_under(root))
                    run_load("fastensor group", location, n, env)
                by_subject: dict[str, list] = {s: [] for s in names}
                for r, order in interleaved(names, args.rounds, seed=11):
                    for name in order:
                        cache = drop_caches(_util.files_under(root))
                        srv = servers.get(source)
                        if srv:
                            srv.reset()
                        out = run_load(name, location, n, env)
                        if srv:
                            out["served"] = srv.sent()
                        by_subject[name].append(out)
                        print(
                            f"{source} N={n} round {r + 1}: {name}: {out['seconds']:.3f} s"
                            f" ({out.get('way')})",
                            flush=True,
                        )
                results[(source, n)] = by_subject
        text = report(results, args, size, cache, missing)
        print(text)
        write_report(args.out, text)
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(root, ignore_errors=True)


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    main()
