"""Fresh-process benchmark of the framework integrations against the frameworks' own I/O.

On a GPT-2-medium-shaped model built locally from a ``GPT2Config`` (24 layers, 1024 wide,
about 1.42 GB of f32 weights; ``--size small`` for a quick check):

* Lightning: ``fastensor.lightning.CheckpointIO`` against the default ``TorchCheckpointIO``
  on a real checkpoint (one AdamW step of a ``Trainer``: weights, optimizer state, loops;
  about 4.3 GB): the save (both sides durable: Lightning's file and directory fsynced) and
  the resume (``trainer.fit(ckpt_path=...)`` until it returns; its ``load_checkpoint`` part
  is reported too); and ``fastensor.lightning.AsyncCheckpointIO`` against Lightning's
  ``AsyncCheckpointIO`` wrapping ``CheckpointIO`` (the same files): two saves with the
  weights changed between them, when each call returns and when both files are written;
* transformers: ``fastensor.transformers.from_pretrained`` against ``from_pretrained`` of a
  ``save_pretrained`` directory, one file and sharded, and ``save_pretrained`` sharded (both
  sides durable);
* DCP in the Hugging Face layout: ``fastensor.dcp_hf`` against torch's
  ``HuggingFaceStorageWriter`` (``save_distributed`` + ``enable_consolidation`` into three
  files; torch's consolidated files and index fsynced) and ``HuggingFaceStorageReader``
  (torch's files, read into an existing state dict).

Each subject runs in a process of its own (imports and set-up before the clock starts), the
page cache dropped before it (``sync`` and ``/proc/sys/vm/drop_caches`` where permitted,
else ``POSIX_FADV_DONTNEED`` on every file of the scratch directory), and every page of
what it loads touched inside the timed region. The groups run one after another; within a
group, rounds are interleaved (each round runs every comparison once, the comparisons in a
shuffled order and each comparison's two sides back to back, in a shuffled order), and each
ratio is taken within its round: the report gives the median ratio with its range, and
every raw time. fastensor's engine starts
without a profile in every process (``FASTENSOR_PROFILE=""``), as on a first run.

    python fastensor-python/bench/integrations.py [--dir DIR] [--rounds 3] [--size medium]
        [--only lightning,transformers,dcp] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _util  # noqa: E402 (the bench's own helpers, beside this file)
from _util import fmt_ratio, fsync_tree, touch  # noqa: E402

# subject -> (group, description)
SUBJECTS = _util.subjects(
    lightning={
        "lightning save: fastensor": "fastensor.lightning.CheckpointIO save",
        "lightning save: torch": "TorchCheckpointIO save + fsync",
        "lightning resume: fastensor": "fit(ckpt_path=) with fastensor.lightning",
        "lightning resume: torch": "fit(ckpt_path=) with TorchCheckpointIO",
        "lightning async saves: fastensor": "fastensor.lightning.AsyncCheckpointIO, 2 saves",
        "lightning async saves: lightning": "AsyncCheckpointIO(CheckpointIO()), 2 saves",
    },
    transformers={
        "from_pretrained one file: fastensor": "fastensor from_pretrained, 1 file",
        "from_pretrained one file: transformers": "from_pretrained, 1 file",
        "from_pretrained sharded: fastensor": "fastensor from_pretrained, sharded",
        "from_pretrained sharded: transformers": "from_pretrained, sharded",
        "save_pretrained sharded: fastensor": "fastensor save_pretrained, sharded",
        "save_pretrained sharded: transformers": "save_pretrained, sharded + fsync",
    },
    dcp={
        "dcp hf save: fastensor": "fastensor.dcp_hf writer, consolidated",
        "dcp hf save: torch": "torch HuggingFaceStorageWriter, consolidated + fsync",
        "dcp hf load: fastensor": "fastensor.dcp_hf reader",
        "dcp hf load: torch": "torch HuggingFaceStorageReader",
    },
)

# (label, fastensor's subject, the anchor, the metric compared)
COMPARE = [
    ("Lightning save (durable)", "lightning save: fastensor", "lightning save: torch", "seconds"),
    (
        "Lightning resume, fit(ckpt_path=)",
        "lightning resume: fastensor",
        "lightning resume: torch",
        "seconds",
    ),
    (
        "Lightning resume, its load_checkpoint",
        "lightning resume: fastensor",
        "lightning resume: torch",
        "load_checkpoint",
    ),
    (
        "Lightning async save, first return",
        "lightning async saves: fastensor",
        "lightning async saves: lightning",
        "first return",
    ),
    (
        "Lightning async save, second return",
        "lightning async saves: fastensor",
        "lightning async saves: lightning",
        "second return",
    ),
    (
        "Lightning async saves, both written",
        "lightning async saves: fastensor",
        "lightning async saves: lightning",
        "seconds",
    ),
    (
        "from_pretrained, one file",
        "from_pretrained one file: fastensor",
        "from_pretrained one file: transformers",
        "seconds",
    ),
    (
        "from_pretrained, sharded",
        "from_pretrained sharded: fastensor",
        "from_pretrained sharded: transformers",
        "seconds",
    ),
    (
        "save_pretrained, sharded (durable)",
        "save_pretrained sharded: fastensor",
        "save_pretrained sharded: transformers",
        "seconds",
    ),
    (
        "DCP HF layout save, consolidated (durable)",
        "dcp hf save: fastensor",
        "dcp hf save: torch",
        "seconds",
    ),
    ("DCP HF layout load", "dcp hf load: fastensor", "dcp hf load: torch", "seconds"),
]

SIZES = {
    # GPT-2 medium: 24 layers, 1024 wide, 16 heads (about 355 M parameters).
    "medium": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "vocab_size": 50257},
    "small": {"n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 5000},
}


# ---------------------------------------------------------------- shared pieces


def gpt2_config(size: str):
    from transformers import GPT2Config

    return GPT2Config(n_positions=1024, bos_token_id=0, eos_token_id=0, **SIZES[size])


def lightning_module(size: str):
    import lightning as L
    import torch
    from transformers import GPT2LMHeadModel

    class LitGPT2(L.LightningModule):
        def __init__(self, size: str) -> None:
            super().__init__()
            self.save_hyperparameters()
            torch.manual_seed(0)
            self.model = GPT2LMHeadModel(gpt2_config(size))

        def training_step(self, batch, batch_idx):
            (ids,) = batch
            return self.model(input_ids=ids, labels=ids).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    return LitGPT2(size)


def lightning_trainer(plugin=None):
    import lightning as L

    return L.Trainer(
        max_steps=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        plugins=[plugin] if plugin is not None else None,
    )


def one_batch():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    ids = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(ids), batch_size=1)


def index_mapping(sd) -> dict[str, int]:
    """Tensor name -> file index 1..3, cut by cumulative size."""
    total = sum(t.numel() * t.element_size() for t in sd.values())
    out, acc = {}, 0
    for k, t in sd.items():
        out[k] = min(3, 1 + acc * 3 // max(total, 1))
        acc += t.numel() * t.element_size()
    return out


# ---------------------------------------------------------------- preparation (children)


def prepare_hf(base: Path, size: str) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import hf_storage
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(gpt2_config(size))
    model.save_pretrained(base / "hf_one")
    sd = load_file(base / "hf_one" / "model.safetensors")
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    shard = max(nbytes // 3 + 1, 1 << 20)
    model.save_pretrained(base / "hf_sharded", max_shard_size=shard)
    writer = hf_storage.HuggingFaceStorageWriter(
        str(base / "dcp_ref"),
        fqn_to_index_mapping=index_mapping(sd),
        save_distributed=True,
        enable_consolidation=True,
    )
    dcp.save(sd, storage_writer=writer, no_dist=True)
    fsync_tree(str(base))
    return {"bytes": nbytes, "tensors": len(sd), "shard_bytes": shard}


def prepare_lightning(base: Path, size: str) -> dict:
    import torch
    from fastensor.lightning import CheckpointIO

    module = lightning_module(size)
    trainer = lightning_trainer()
    trainer.fit(module, one_batch())
    trainer.save_checkpoint(base / "lit_torch.ckpt")
    del trainer, module
    ckpt = torch.load(base / "lit_torch.ckpt", weights_only=False)
    CheckpointIO().save_checkpoint(ckpt, base / "lit_ours.ckpt")
    fsync_tree(str(base / "lit_torch.ckpt"))
    return {"lightning_bytes": os.path.getsize(base / "lit_torch.ckpt")}


# ---------------------------------------------------------------- the subjects (children)


def child(subject: str, base: Path, size: str) -> dict:
    """Runs ``subject`` in this fresh process; returns its timings."""
    import torch

    touch([torch.zeros(1 << 16)])  # touch's kernels loaded before the clock starts
    out = str(base / "out")
    times: dict[str, float] = {}
    if subject.startswith("lightning save"):
        ckpt = _lightning_checkpoint(base)
        io_ = _lightning_io(subject)
        path = os.path.join(out, "last.ckpt")
        os.makedirs(out, exist_ok=True)
        t0 = time.perf_counter()
        io_.save_checkpoint(ckpt, path)
        if subject.endswith("torch"):
            fsync_tree(path)
        times["seconds"] = time.perf_counter() - t0
    elif subject.startswith("lightning async saves"):
        # Two saves a training step apart, as a Trainer makes them: when each call returns
        # (training goes on), and when both files are written (teardown, as at fit's end).
        ckpt = _lightning_checkpoint(base)
        io_ = _lightning_io(subject)
        os.makedirs(out, exist_ok=True)
        weights = ckpt["state_dict"]
        t0 = time.perf_counter()
        for i, metric in enumerate(("first return", "second return")):
            t = time.perf_counter()
            io_.save_checkpoint(ckpt, os.path.join(out, f"step{i}.ckpt"))
            times[metric] = time.perf_counter() - t
            for w in weights.values():  # the step between the saves
                w.add_(1)
        io_.teardown()
        times["seconds"] = time.perf_counter() - t0
    elif subject.startswith("lightning resume"):
        io_ = _lightning_io(subject)
        path = base / ("lit_ours.ckpt" if subject.endswith("fastensor") else "lit_torch.ckpt")
        load = io_.load_checkpoint

        def timed_load(*args, **kwargs):
            t = time.perf_counter()
            try:
                return load(*args, **kwargs)
            finally:
                times["load_checkpoint"] = time.perf_counter() - t

        io_.load_checkpoint = timed_load
        module = lightning_module(size)
        trainer = lightning_trainer(io_)
        loader = one_batch()
        t0 = time.perf_counter()
        trainer.fit(module, loader, ckpt_path=path)
        touch(module.parameters())
        touch(v for s in trainer.optimizers[0].state.values() for v in s.values())
        times["seconds"] = time.perf_counter() - t0
    elif subject.startswith("from_pretrained"):
        import fastensor.transformers as ft
        from transformers import GPT2LMHeadModel

        path = base / ("hf_one" if "one file" in subject else "hf_sharded")
        t0 = time.perf_counter()
        if subject.endswith("fastensor"):
            model = ft.from_pretrained(GPT2LMHeadModel, path)
        else:
            model = GPT2LMHeadModel.from_pretrained(path)
        touch(model.state_dict().values())
        times["seconds"] = time.perf_counter() - t0
    elif subject.startswith("save_pretrained"):
        import fastensor.transformers as ft
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(base / "hf_one")
        shard = json.loads((base / "prepared.json").read_text())["shard_bytes"]
        t0 = time.perf_counter()
        if subject.endswith("fastensor"):
            ft.save_pretrained(model, out, max_shard_size=shard)
        else:
            model.save_pretrained(out, max_shard_size=shard)
            fsync_tree(out)
        times["seconds"] = time.perf_counter() - t0
    elif subject.startswith("dcp hf"):
        times["seconds"] = _dcp(subject, base, out)
    else:
        raise SystemExit(f"unknown subject {subject}")
    usage = os.times()
    times.update(user=usage.user, sys=usage.system)
    return times


def _lightning_io(subject: str):
    """The checkpoint plugin a Lightning subject times: fastensor's (``...: fastensor``), or
    the one it is compared with (Lightning's default, or for async saves Lightning's
    ``AsyncCheckpointIO`` over fastensor's ``CheckpointIO``)."""
    ours = subject.endswith("fastensor")
    if subject.startswith("lightning async saves"):
        if ours:
            from fastensor.lightning import AsyncCheckpointIO

            return AsyncCheckpointIO()
        from fastensor.lightning import CheckpointIO
        from lightning.pytorch.plugins.io import AsyncCheckpointIO

        return AsyncCheckpointIO(CheckpointIO())
    if ours:
        from fastensor.lightning import CheckpointIO

        return CheckpointIO()
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    return TorchCheckpointIO()


def _lightning_checkpoint(base: Path) -> dict:
    """The prepared Lightning checkpoint (``prepare_lightning``'s), loaded, every page of its
    tensors touched."""
    import torch

    ckpt = torch.load(base / "lit_torch.ckpt", weights_only=False)
    touch(t for t in _tensors_in(ckpt))
    return ckpt


def _tensors_in(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors_in(v)


def _dcp(subject: str, base: Path, out: str) -> float:
    import warnings

    import torch.distributed.checkpoint as dcp
    from fastensor import dcp_hf
    from safetensors.torch import load_file
    from torch.distributed.checkpoint import hf_storage

    warnings.simplefilter("ignore")  # (no process group: single-process DCP)
    ours = subject.endswith("fastensor")
    sd = {k: v.clone() for k, v in load_file(base / "hf_one" / "model.safetensors").items()}
    if "save" in subject:
        touch(sd.values())
        cls = dcp_hf.HuggingFaceStorageWriter if ours else hf_storage.HuggingFaceStorageWriter
        writer = cls(
            out,
            fqn_to_index_mapping=index_mapping(sd),
            save_distributed=True,
            enable_consolidation=True,
        )
        t0 = time.perf_counter()
        dcp.save(sd, storage_writer=writer, no_dist=True)
        if not ours:
            fsync_tree(out)
        return time.perf_counter() - t0
    for v in sd.values():
        v.zero_()  # an existing state's memory, faulted in
    cls = dcp_hf.HuggingFaceStorageReader if ours else hf_storage.HuggingFaceStorageReader
    t0 = time.perf_counter()
    dcp.load(sd, storage_reader=cls(str(base / "dcp_ref")), no_dist=True)
    touch(sd.values())
    elapsed = time.perf_counter() - t0
    assert any(bool(v.any()) for v in sd.values()), "nothing was loaded"
    return elapsed


# ---------------------------------------------------------------- the driver


def drop_caches(base: Path) -> str:
    """Drops the page cache: all of it where permitted, else the scratch files' (see
    ``_util.drop_caches``)."""
    return _util.drop_caches(_util.files_under(base))


def rounds(groups: set[str], count: int, seed: int) -> list[tuple[int, list[str]]]:
    """The runs in order: one group after another (a group's heavy writes never land between
    another group's two sides), each group's ``count`` rounds with its comparisons' pairs
    back to back (``_util.paired``)."""
    schedule = []
    for group in dict.fromkeys(g for g, _ in SUBJECTS.values()):
        if group not in groups:
            continue
        pairs = dict.fromkeys(
            (ours, theirs) for _, ours, theirs, _ in COMPARE if SUBJECTS[ours][0] == group
        )
        schedule += list(_util.paired(pairs, count, seed))
    return schedule


def run_child(subject: str, base: Path, size: str) -> dict:
    cmd = [sys.executable, __file__, "--child", subject, "--dir", str(base), "--size", size]
    env = dict(os.environ, FASTENSOR_PROFILE="", TRANSFORMERS_VERBOSITY="error")
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{subject} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(times: dict, args, cache_note: str, prepared: dict) -> str:
    gb = prepared["bytes"] / 1e9
    lines = [
        f"GPT-2 ({args.size}: {prepared['tensors']} tensors, {gb:.2f} GB f32 weights"
        + (
            f"; Lightning checkpoint {prepared['lightning_bytes'] / 1e9:.2f} GB"
            if "lightning_bytes" in prepared
            else ""
        )
        + f"); fresh process per subject, {args.rounds} interleaved rounds per group (each "
        "comparison's two sides back to back); page cache: "
        f"{cache_note}.",
        "",
        "| fastensor vs the framework's own | per-round ratio (> 1: fastensor faster) |",
        "|---|---|",
    ]
    for label, ours, theirs, metric in COMPARE:
        if ours in times and theirs in times:
            a, b = times[ours][metric], times[theirs][metric]
            ratios = [t / o for o, t in zip(a, b, strict=True)]
            lines.append(f"| {label} | {fmt_ratio(ratios)} |")
    lines += ["", "| subject | metric | median s | every round (s) |", "|---|---|---|---|"]
    for name, metrics in times.items():
        for metric, values in metrics.items():
            if metric in ("user", "sys"):
                continue
            raw = ", ".join(f"{v:.3f}" for v in values)
            lines.append(
                f"| {SUBJECTS[name][1]} | {metric} | {statistics.median(values):.3f} | {raw} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: temp)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", choices=sorted(SIZES), default="medium")
    ap.add_argument(
        "--only",
        default="lightning,transformers,dcp",
        help="comma-separated groups: lightning, transformers, dcp",
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        base = args.dir
        if args.child == "prepare-hf":
            result = prepare_hf(base, args.size)
        elif args.child == "prepare-lightning":
            result = prepare_lightning(base, args.size)
        else:
            result = child(args.child, base, args.size)
        print(json.dumps(result))
        return
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    groups = set(args.only.split(","))
    unknown = groups - {"lightning", "transformers", "dcp"}
    if unknown:
        ap.error(f"unknown group(s) {sorted(unknown)}")
    base = _util.scratch("fastensor-integrations-", args.dir)
    try:
        t0 = time.perf_counter()
        prepared = run_child("prepare-hf", base, args.size)
        if "lightning" in groups:
            prepared.update(run_child("prepare-lightning", base, args.size))
        (base / "prepared.json").write_text(json.dumps(prepared))
        print(f"prepared in {time.perf_counter() - t0:.1f} s: {prepared}", flush=True)
        times: dict[str, dict[str, list[float]]] = {
            s: {} for s, (g, _) in SUBJECTS.items() if g in groups
        }
        cache_note = ""
        for r, order in rounds(groups, args.rounds, args.seed):
            for s in order:
                shutil.rmtree(base / "out", ignore_errors=True)
                cache_note = drop_caches(base)
                time.sleep(0.2)
                result = run_child(s, base, args.size)
                for metric, value in result.items():
                    times[s].setdefault(metric, []).append(value)
                shown = ", ".join(f"{k} {v:.3f}" for k, v in result.items())
                print(f"round {r + 1} {s}: {shown}", flush=True)
        shutil.rmtree(base / "out", ignore_errors=True)
        text = report(times, args, cache_note, prepared)
        print(text)
        _util.write_report(args.out, text)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
