"""Runs one scenario of ``dcp_worker.py`` on several processes (gloo, CPU) for the tests.

The ranks are forked from a forkserver that has imported torch once (an import of torch
costs seconds of CPU on a small machine; four at once, a minute). Each run gets a free port
and a deadline after which every rank is killed; a failure reports every rank's output.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from pathlib import Path

_PRELOAD = ["torch", "torch.distributed.checkpoint", "fastensor.dcp", "dcp_worker", "group_worker"]
_ctx = None


def _context():
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(_PRELOAD)
    return _ctx


def rank_environment(rank: int, world: int, port: int) -> None:
    """Sets the environment ``torch.distributed``'s ``env://`` start reads for ``rank`` of
    ``world`` (rendezvous on localhost ``port``), with no fastensor profile learnt into."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),  # (every rank on this host, as torchrun says it)
        FASTENSOR_PROFILE="",
    )


def free_port() -> int:
    """A TCP port free on localhost now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(
    scenario: str,
    world: int,
    directory: Path,
    timeout: float = 120.0,
    worker: str = "dcp_worker",
    may_die: frozenset[int] = frozenset(),
) -> list[str]:
    """Runs ``scenario`` of the module ``worker`` (its ``entry``) on ``world`` ranks;
    returns each rank's output, or raises ``AssertionError`` with every rank's output when
    one fails (a rank of ``may_die`` may end as it likes) or the deadline passes."""
    import importlib

    module = importlib.import_module(worker)
    ctx = _context()
    port = free_port()
    logs = [directory / f"{scenario}.rank{r}.log" for r in range(world)]
    procs = [
        ctx.Process(
            target=module.entry,
            args=(scenario, str(directory), r, world, port, str(logs[r])),
            daemon=True,
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    failed = None
    while True:
        codes = [p.exitcode for p in procs]
        if any(c not in (None, 0) for r, c in enumerate(codes) if r not in may_die):
            failed = "a rank failed"
            break
        if all(c == 0 or (r in may_die and c is not None) for r, c in enumerate(codes)):
            break
        if time.monotonic() > deadline:
            failed = f"the scenario did not finish within {timeout:.0f} s"
            break
        time.sleep(0.05)
    if failed:
        time.sleep(0.5)  # the other ranks report their side
        for p in procs:
            if p.exitcode is None:
                p.kill()
    for p in procs:
        p.join(10)
    outputs = [log.read_text() if log.exists() else "" for log in logs]
    if failed:
        report = "\n".join(
            f"--- rank {r} (exit {p.exitcode}) ---\n{out[-4000:]}"
            for r, (p, out) in enumerate(zip(procs, outputs, strict=False))
        )
        raise AssertionError(f"{scenario} on {world} ranks: {failed}\n{report}")
    return outputs


def logged_entry(run, scenario: str, directory: str, rank: int, world: int, port: int, log: str):
    """A forked rank's life: the environment of ``rank``, its output to ``log``, then
    ``run(scenario, Path(directory), rank, world)``; exits 0, or 1 with the traceback
    logged."""
    import sys

    rank_environment(rank, world, port)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    try:
        run(scenario, Path(directory), rank, world)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)
