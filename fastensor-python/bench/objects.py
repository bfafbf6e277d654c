"""Object-storage benchmark: checkpoints loaded from and saved to ``s3://`` on a local S3
server, each subject in a fresh process.

The server is ``fastensor-s3-server`` (s3s-fs serving a directory of this machine's disk,
on the loopback interface), so the network is the loopback and the limit is the server's
(its reads and writes of its files, its HTTP handling): that limit is measured in the same
run by ``limit`` (fastensor-object's example: parallel ranged GETs, each copied into its
place in memory faulted in beforehand, as the local benchmark's raw ``O_DIRECT`` read; a
multipart upload of one preallocated buffer), and every subject is compared
with it and with the anchors in the same round. Before each subject the page cache is
dropped (the server's files included), and every loaded tensor's pages are touched inside
the timed region. Each subject runs with its library's defaults.

Loads: fastensor ``load_file("s3://...")``; Run:ai's streamer (``runai-model-streamer-s3``,
``SafetensorsStreamer``, each tensor cloned out of its reused buffer into a state dict, as
``load_file`` returns one); boto3's ``download_fileobj`` (its threaded ranged transfer) then
``safetensors.torch.load`` of the bytes; the raw ranged-GET limit. Through the local cache
of remote checkpoints (``FASTENSOR_CACHE_DIR``): a load whose version is cached (one HEAD,
then the local copy), against ``load_file`` of the same file on the local disk; and a load
that fetches into an empty cache. The other clouds: ``load_file("gs://...")`` against the
same server answering GCS's XML API (``--anonymous``), and ``load_file("az://...")``
against Azurite (where ``FASTENSOR_AZURITE`` names its ``azurite-blob``): emulators, so
these say what the client path costs on the loopback, not what a cloud gives. Saves: fastensor
``save_file("s3://...")``; ``safetensors.torch.save`` then boto3's ``upload_fileobj``; the raw
multipart limit.

    scripts/bench objects [--rounds 3] [--scale 0.5] [--out docs/lab/runs/objects-DATE.md]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _util  # the bench's own helpers, beside this file
from _util import drop_caches, fmt_ratio, interleaved, subjects, touch, write_report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUCKET = "bench"
MODEL = f"s3://{BUCKET}/model.safetensors"

SUBJECTS = subjects(
    load={
        "fastensor.load_file": "fastensor.torch.load_file('s3://...')",
        "cached": "load_file('s3://...') with FASTENSOR_CACHE_DIR holding its version",
        "local file": "load_file of the same file on the local disk (what `cached` is held to)",
        "cache miss": "load_file('s3://...') with an empty FASTENSOR_CACHE_DIR: fetched, then"
        " loaded from the local copy",
        "gs://": "load_file('gs://...'), the same server answering GCS's XML API",
        "az://": "load_file('az://...'), Azurite (Azure's emulator, Node.js)",
        "runai": "runai_model_streamer SafetensorsStreamer, tensors cloned into a dict",
        "boto3+safetensors": "boto3 download_fileobj, then safetensors.torch.load",
        "raw GET limit": "parallel ranged GETs (8 MiB, 16 in flight), each copied into its"
        " place in memory faulted in beforehand",
    },
    save={
        "fastensor.save_file": "fastensor.torch.save_file('s3://...')",
        "safetensors+boto3": "safetensors.torch.save, then boto3 upload_fileobj",
        "raw multipart limit": "multipart upload of one preallocated buffer (16 MiB parts,"
        " 16 in flight)",
    },
)


def state_dict(scale: float):
    sys.path.insert(0, str(HERE))
    from checkpoint import gpt2_medium

    return gpt2_medium(scale)


def child(subject: str, scale: float, limit: str) -> dict:
    """Runs one subject in this (fresh) process; returns its time."""
    import torch

    kind = SUBJECTS[subject][0]
    touch([torch.zeros(1 << 16)])
    if subject.startswith("raw"):
        op = ["get", MODEL] if kind == "load" else ["put", f"s3://{BUCKET}/raw", str(nbytes())]
        out = subprocess.run([limit, *op], check=True, capture_output=True, text=True).stdout
        return {"seconds": json.loads(out)["seconds"]}
    if kind == "save":
        sd = state_dict(scale)
        touch(sd.values())
        t0 = time.perf_counter()
        save(subject, sd)
        return {"seconds": time.perf_counter() - t0}
    if subject in ("cached", "cache miss"):
        os.environ["FASTENSOR_CACHE_DIR"] = os.environ["FASTENSOR_BENCH_CACHE"]
        if subject == "cache miss":
            shutil.rmtree(os.environ["FASTENSOR_BENCH_CACHE"] + "-miss", ignore_errors=True)
            os.environ["FASTENSOR_CACHE_DIR"] += "-miss"
    prepare = loader(subject)
    t0 = time.perf_counter()
    tensors = prepare()
    touch(tensors.values())
    return {"seconds": time.perf_counter() - t0}


def nbytes() -> int:
    return int(os.environ["FASTENSOR_BENCH_BYTES"])


def loader(subject: str):
    if subject in ("fastensor.load_file", "cached", "cache miss"):
        import fastensor.torch as ft

        return lambda: ft.load_file(MODEL)
    if subject in ("gs://", "az://"):
        import fastensor.torch as ft

        return lambda: ft.load_file(f"{subject}ckpt/model.safetensors")
    if subject == "local file":
        import fastensor.torch as ft

        return lambda: ft.load_file(os.environ["FASTENSOR_BENCH_LOCAL"])
    if subject == "runai":
        from runai_model_streamer import SafetensorsStreamer

        def runai():
            out = {}
            with SafetensorsStreamer() as streamer:
                streamer.stream_file(MODEL)
                for name, t in streamer.get_tensors():
                    out[name] = t.clone()
            return out

        return runai
    if subject == "boto3+safetensors":
        import boto3
        import safetensors.torch as st

        client = boto3.client("s3")

        def boto():
            buf = io.BytesIO()
            client.download_fileobj(BUCKET, "model.safetensors", buf)
            return st.load(buf.getvalue())

        return boto
    raise SystemExit(f"unknown subject {subject}")


def save(subject: str, sd) -> None:
    if subject == "fastensor.save_file":
        import fastensor.torch as ft

        ft.save_file(sd, f"s3://{BUCKET}/saved.safetensors")
    elif subject == "safetensors+boto3":
        import boto3
        import safetensors.torch as st

        data = st.save(sd)
        boto3.client("s3").upload_fileobj(io.BytesIO(data), BUCKET, "saved-boto3.safetensors")
    else:
        raise SystemExit(f"unknown subject {subject}")


def run_child(subject: str, args, env: dict[str, str]) -> dict:
    cmd = [sys.executable, __file__, "--child", subject, "--scale", str(args.scale)]
    cmd += ["--limit", args.limit]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{subject} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_server(binary: str, root: Path) -> tuple[subprocess.Popen, str]:
    (root / BUCKET).mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [binary, "--root", str(root), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def report(times: dict[str, list[float]], args, cache: str, size: int, missing: list) -> str:
    rounds = len(times["fastensor.load_file"])
    lines = [
        f"Object storage, {size / 1e9:.2f} GB checkpoint (GPT-2-medium-shaped, scale"
        f" {args.scale}), {rounds} rounds, fresh process per subject, page cache {cache}.",
        "Server: fastensor-s3-server (s3s-fs) on the loopback interface: the limit is the"
        " server's, measured in the same run.",
        "",
        "| subject | median s | GB/s | fastensor's ratio (per round) |",
        "|---|---|---|---|",
    ]

    def ratios(ours: str, other: str) -> list[float]:
        return [o / f for f, o in zip(times[ours], times[other], strict=True)]

    for name in SUBJECTS:
        if name not in times:
            continue
        med = statistics.median(times[name])
        ours = "fastensor.load_file" if SUBJECTS[name][0] == "load" else "fastensor.save_file"
        ratio = "" if name == ours else fmt_ratio(ratios(ours, name))
        lines.append(f"| {name} | {med:.3f} | {size / med / 1e9:.2f} | {ratio} |")
    lines += ["", "Raw times (s):", ""]
    for name, ts in times.items():
        lines.append(f"- {name}: {', '.join(f'{t:.3f}' for t in ts)}")
    for store in ("gs://", "az://"):
        if store in times:
            lines += [
                "",
                f"{store} against s3:// (per round): "
                f"{fmt_ratio(ratios(store, 'fastensor.load_file'))} (s3 time / {store} time)",
            ]
    if "cached" in times:
        lines += [
            "",
            "A cached load against a load of the local file (per round):"
            f" {fmt_ratio(ratios('cached', 'local file'))} (local time / cached time)",
        ]
    if missing:
        lines += ["", f"Not installed, left out: {', '.join(missing)}."]
    lines += ["", "Subjects:", ""]
    lines += [f"- {n}: {d}" for n, (_, d) in SUBJECTS.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--dir", default=None, help="where the server keeps its files")
    ap.add_argument("--server", default=os.environ.get("FASTENSOR_S3_SERVER"))
    ap.add_argument("--limit", default=os.environ.get("FASTENSOR_S3_LIMIT"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.scale, args.limit)))
        return
    if not args.server or not args.limit:
        raise SystemExit("--server and --limit (or FASTENSOR_S3_SERVER, FASTENSOR_S3_LIMIT)")
    root = _util.scratch("fastensor-objects-", args.dir)
    proc, endpoint = start_server(args.server, root)
    # The other clouds' emulators (tests/_s3.py: the same server for GCS, Azurite).
    sys.path.insert(0, str(HERE.parent / "tests"))
    from _s3 import Azurite, S3Server

    clouds: list = [S3Server(args.server, root / "gs", anonymous=True)]
    if os.environ.get("FASTENSOR_AZURITE"):
        clouds.append(Azurite(os.environ["FASTENSOR_AZURITE"], root / "az"))
    env = dict(
        os.environ,
        FASTENSOR_PROFILE="",
        AWS_ACCESS_KEY_ID="fastensor",
        AWS_SECRET_ACCESS_KEY="fastensor-secret",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
        AWS_EC2_METADATA_DISABLED="true",
        RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0",
    )
    try:
        os.environ.update(env)
        import fastensor
        import fastensor.torch as ft

        sd = state_dict(args.scale)
        ft.save_file(sd, MODEL)  # through the server: it keeps the object's ETag
        size = (root / BUCKET / "model.safetensors").stat().st_size
        env["FASTENSOR_BENCH_BYTES"] = str(size)
        (root / "local").mkdir()
        shutil.copyfile(root / BUCKET / "model.safetensors", root / "local/model.safetensors")
        env["FASTENSOR_BENCH_LOCAL"] = str(root / "local/model.safetensors")
        env["FASTENSOR_BENCH_CACHE"] = str(root / "cache")
        ft.load_file(MODEL, engine=fastensor.Engine(cache_dir=root / "cache"))
        for store in clouds:
            env.update(store.env())
            os.environ.update(store.env())
            ft.save_file(sd, store.url("model.safetensors"))
        del sd
        missing = []
        names = list(SUBJECTS)
        for name, mod in (("runai", "runai_model_streamer"), ("boto3+safetensors", "boto3")):
            try:
                __import__(mod)
            except ImportError:
                names.remove(name)
                missing.append(name)
        if "boto3" in missing:
            names.remove("safetensors+boto3")
        if len(clouds) < 2:
            names.remove("az://")
            missing.append("az:// (FASTENSOR_AZURITE unset)")
        times: dict[str, list[float]] = {n: [] for n in names}
        cache = ""
        for r, order in interleaved(names, args.rounds, seed=7):
            for name in order:
                cache = drop_caches(_util.files_under(root))
                t = run_child(name, args, env)["seconds"]
                times[name].append(t)
                print(f"round {r + 1}: {name}: {t:.3f} s", flush=True)
        text = report(times, args, cache, size, missing)
        print(text)
        write_report(args.out, text)
    finally:
        for store in clouds:
            store.stop()
        proc.terminate()
        proc.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
