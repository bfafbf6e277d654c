"""Runs one scenario of ``dcp_worker.py`` on several processes (gloo, CPU) for the tests:
free port, one subprocess per rank, a deadline after which every rank is killed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).with_name("dcp_worker.py")


def free_port() -> int:
    """A TCP port free on localhost now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(scenario: str, world: int, directory: Path, timeout: float = 120.0) -> list[str]:
    """Runs ``scenario`` on ``world`` ranks; returns each rank's output, or raises
    ``AssertionError`` with every rank's output when one fails or the deadline passes."""
    port = free_port()
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        FASTENSOR_PROFILE="",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    procs = []
    logs = []
    for rank in range(world):
        log = open(directory / f"{scenario}.rank{rank}.log", "w+")  # noqa: SIM115
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), scenario, str(directory)],
                env={**env, "RANK": str(rank)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    deadline = time.monotonic() + timeout
    failed = None
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            failed = "a rank failed"
            break
        if all(c == 0 for c in codes):
            break
        if time.monotonic() > deadline:
            failed = f"the scenario did not finish within {timeout:.0f} s"
            break
        time.sleep(0.05)
    if failed:
        # Give the other ranks a moment to report, then stop them.
        time.sleep(0.5)
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p in procs:
        p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    if failed:
        report = "\n".join(
            f"--- rank {r} (exit {p.returncode}) ---\n{out[-4000:]}"
            for r, (p, out) in enumerate(zip(procs, outputs))
        )
        raise AssertionError(f"{scenario} on {world} ranks: {failed}\n{report}")
    return outputs
