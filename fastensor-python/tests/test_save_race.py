"""A save racing another thread that gives the saved tensor new memory (``resize_``, a
storage resized to nothing and back): never a dead interpreter; the save raises a typed
error or writes the bytes the tensor held. Run in a child process, so that a signal fails
the test instead of ending the session."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

RUNS = 50

_CHILD = textwrap.dedent(
    """
    import random, sys, threading, time
    import torch
    import fastensor.torch as ft
    from fastensor.errors import FastensorError

    directory, runs = sys.argv[1], int(sys.argv[2])
    n = 1 << 24  # 64 MiB: memory the allocator maps and unmaps on its own
    rng = random.Random(0)
    saved = errors = 0
    for run in range(runs):
        t = torch.ones(n)
        go = threading.Event()
        delay = rng.uniform(0.002, 0.04)

        def change():
            go.wait()
            time.sleep(delay)
            if run % 2:
                t.resize_(4 * n)  # new memory; the old freed
                t.resize_(10)
            else:
                storage = t.untyped_storage()
                storage.resize_(0)  # the memory freed, as FSDP frees a parameter's
                storage.resize_(4 * n)

        thread = threading.Thread(target=change)
        thread.start()
        path = f"{directory}/race-{run % 2}.safetensors"
        go.set()
        try:
            ft.save_file({"t": t}, path, checksum=run % 4 == 1)
        except FastensorError as exc:
            errors += 1
            print("error:", type(exc).__name__, exc)
            thread.join()
            continue
        thread.join()
        back = ft.load_file(path)["t"]
        # The bytes the tensor held: all of its first n, whatever its size then.
        assert back.numel() in (n, 4 * n, 10), back.shape
        assert bool((back[:n] == 1).all()), run
        saved += 1
    print(f"saved {saved}, errors {errors}")
    """
)


def test_a_save_racing_a_resize_never_kills_the_interpreter(tmp_path):
    shm = "/dev/shm"
    directory = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else str(tmp_path)
    directory = os.path.join(directory, f"fastensor-race-{os.getpid()}")
    os.makedirs(directory, exist_ok=True)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, directory, str(RUNS)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "FASTENSOR_PROFILE": ""},
        )
    finally:
        for f in os.listdir(directory):
            os.unlink(os.path.join(directory, f))
        os.rmdir(directory)
    assert done.returncode == 0, f"signal or failure ({done.returncode}):\n{done.stderr[-3000:]}"
    saved, errors = re.search(r"saved (\d+), errors (\d+)", done.stdout).groups()
    assert int(saved) + int(errors) == RUNS, done.stdout


@pytest.mark.skipif(not hasattr(torch, "_lazy_clone"), reason="torch without copy-on-write")
def test_a_save_lends_a_copy_on_write_clone_and_leaves_the_tensor_its_own(tmp_path):
    from fastensor import _torch_hold

    if not _torch_hold._SUPPORTED:
        pytest.skip("torch without a read-only DLPack export")
    import fastensor.torch as ft

    t = torch.arange(1 << 20, dtype=torch.float32)
    before = t.data_ptr()
    ft.save_file({"t": t}, tmp_path / "c.safetensors")
    # The save copied nothing and left the tensor its memory: a write after it copies
    # nothing either (the tensor is the memory's only owner again).
    t.add_(1)
    assert t.data_ptr() == before
    assert torch.equal(ft.load_file(tmp_path / "c.safetensors")["t"] + 1, t)
    # A storage resized to less than the tensor covers is refused, not read past its end.
    u = torch.ones(1 << 10)
    u.untyped_storage().resize_(16)
    with pytest.raises(ValueError, match="storage"):
        ft.save_file({"u": u}, tmp_path / "u.safetensors")
