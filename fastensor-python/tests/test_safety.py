"""Fork, special files, symlinks, concurrent replaces and huge tensor counts: each ends in
correct data or a typed error naming the file; nothing hangs (every child and every call
that could block runs under a deadline)."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import fastensor
import fastensor.torch
import pytest
import torch
from fastensor import errors
from fastensor.torch import load_file, load_sharded, save_file

DEADLINE_S = 60


def wait_child(pid: int, deadline_s: float = DEADLINE_S) -> int:
    """The child's exit code; kills it and fails the test when it outlives the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"child {pid} hung (killed after {deadline_s} s)")


def run_python(code: str, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung (killed after {timeout} s):\n{code}")


def pinnable_backends() -> list[str]:
    return [
        b.name for b in fastensor.backends() if b.available and b.name not in ("gds", "cuda-staged")
    ]


def two_files(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({f"t{i}": torch.full((4096 + i,), 1.0) for i in range(64)}, a)
    save_file({f"t{i}": torch.full((4096 + i,), 2.0) for i in range(64)}, b)
    return a, b


def all_equal(tensors: dict, value: float) -> bool:
    return all(bool((t == value).all()) for t in tensors.values())


# 1. Fork safety: every backend, in the middle of loads and saves, and DataLoader workers.


@pytest.mark.parametrize("backend", pinnable_backends())
def test_fork_between_loads_keeps_parent_and_child_apart(tmp_path, backend):
    a, b = two_files(tmp_path)
    eng = fastensor.Engine(pin=backend)
    for _ in range(3):
        assert all_equal(load_file(a, engine=eng), 1.0)
    pid = os.fork()
    if pid == 0:  # the child: its own loads of B, with the engine it inherited
        code = 0
        try:
            for _ in range(20):
                if not all_equal(load_file(b, engine=eng), 2.0):
                    code = 3
        except BaseException:
            code = 4
        os._exit(code)
    wrong = 0
    for _ in range(20):
        wrong += not all_equal(load_file(a, engine=eng), 1.0)
    assert wait_child(pid) == 0
    assert wrong == 0


def test_fork_while_another_thread_saves(tmp_path):
    stop = threading.Event()
    errors_seen = []

    def saver():
        i = 0
        while not stop.is_set():
            try:
                save_file({"x": torch.full((1 << 16,), float(i))}, tmp_path / "bg.safetensors")
            except Exception as exc:  # noqa: BLE001 (reported below)
                errors_seen.append(exc)
            i += 1

    th = threading.Thread(target=saver)
    th.start()
    try:
        for k in range(12):
            time.sleep(0.005 * k)
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    p = tmp_path / f"child{k}.safetensors"
                    save_file({"y": torch.full((1000,), float(k))}, p)
                    if not all_equal(load_file(p), float(k)):
                        code = 3
                except BaseException:
                    code = 4
                os._exit(code)
            assert wait_child(pid) == 0
    finally:
        stop.set()
        th.join()
    assert not errors_seen


def test_a_background_save_of_the_parent_cannot_be_waited_for_in_a_child(tmp_path):
    handle = fastensor.torch.save_file_async({"v": torch.ones(1 << 20)}, tmp_path / "m.safetensors")
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            handle.wait()
            code = 3  # must not pretend the parent's save is its own
        except RuntimeError as exc:
            code = 0 if "parent" in str(exc) else 5
        except BaseException:
            code = 4
        os._exit(code)
    assert wait_child(pid) == 0
    handle.wait()
    assert torch.equal(load_file(tmp_path / "m.safetensors")["v"], torch.ones(1 << 20))


def test_dataloader_fork_workers_use_the_default_engine(tmp_path):
    a, b = two_files(tmp_path)
    assert all_equal(load_file(a), 1.0)  # the parent's default engine is in use

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            tensors = load_file(b if i % 2 else a)
            return torch.stack([t[:4096] for t in tensors.values()]).mean()

    loader = torch.utils.data.DataLoader(
        Files(), batch_size=4, num_workers=2, multiprocessing_context="fork", timeout=DEADLINE_S
    )
    values = torch.cat(list(loader))
    assert values.tolist() == [1.0, 2.0] * 8
    assert all_equal(load_file(a), 1.0)


# 3. Planning is linear: 200k one-byte tensors load within 2x safetensors' time.


def test_two_hundred_thousand_tiny_tensors_load_about_as_fast_as_safetensors(tmp_path):
    import safetensors.torch

    n = 200_000
    path = tmp_path / "many.safetensors"
    tensors = {f"t{i}": torch.tensor([i % 251], dtype=torch.uint8) for i in range(n)}
    safetensors.torch.save_file(tensors, path)

    def best_of(fn, k=2):
        best = float("inf")
        for _ in range(k):
            t0 = time.perf_counter()
            out = fn(path)
            best = min(best, time.perf_counter() - t0)
        return best, out

    theirs, _ = best_of(safetensors.torch.load_file)
    ours, loaded = best_of(load_file)
    assert len(loaded) == n
    assert all(loaded[f"t{i}"].item() == i % 251 for i in range(0, n, 997))
    assert ours <= 2 * theirs + 0.5, f"fastensor {ours:.2f} s vs safetensors {theirs:.2f} s"


# 4. The shard index is opened with the checkpoint's special-file guards.


def test_a_fifo_as_the_index_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors.index.json")
    out = run_python(
        f"""
        from fastensor.torch import load_sharded
        try:
            load_sharded({os.fspath(tmp_path)!r})
        except ValueError as e:
            print("refused:", e)
        """
    )
    assert "refused:" in out.stdout, out.stderr
    assert "model.safetensors.index.json" in out.stdout


def test_an_index_linked_to_dev_zero_is_refused_with_bounded_memory(tmp_path):
    os.symlink("/dev/zero", tmp_path / "model.safetensors.index.json")
    out = run_python(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from fastensor.torch import load_sharded
        try:
            load_sharded({os.fspath(tmp_path)!r})
        except (ValueError, OSError) as e:
            print("refused:", type(e).__name__, e)
        """
    )
    assert "refused:" in out.stdout, out.stderr
    with pytest.raises((ValueError, OSError)):
        load_sharded(tmp_path)


# 5. A save through another user's symlink cannot replace a file elsewhere.


def test_a_save_replaces_a_symlink_it_is_given_not_its_target(tmp_path):
    victim = tmp_path / "victim.safetensors"
    save_file({"v": torch.ones(4)}, victim)
    before = victim.read_bytes()
    link = tmp_path / "link.safetensors"
    os.symlink(victim, link)
    save_file({"w": torch.zeros(8)}, link)
    assert victim.read_bytes() == before
    assert not os.path.islink(link)
    assert set(load_file(link)) == {"w"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another user")
def test_a_save_through_another_users_link_in_a_sticky_directory_changes_nothing(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only")
    os.chmod(secret, 0o600)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    link = shared / "ckpt.safetensors"
    os.symlink(secret, link)
    os.lchown(link, 65534, 65534)
    with contextlib.suppress(OSError):  # refusing is fine; writing through the link is not
        save_file({"w": torch.zeros(8)}, link)
    assert secret.read_bytes() == b"root only"
    assert oct(secret.stat().st_mode & 0o777) == oct(0o600)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another user")
def test_a_save_as_root_over_another_users_file_keeps_it_roots(tmp_path):
    os.chmod(tmp_path, 0o1777)  # a sticky directory anyone may write, as /tmp
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(8)}, path)
    os.chown(path, 65534, 65534)
    os.chmod(path, 0o640)
    save_file({"w": torch.ones(8)}, path)
    st = path.stat()
    assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (0, 65534, oct(0o640))


# 6. A load racing an atomic replace gets one whole version, or a builtin-typed error.


def test_loads_during_atomic_replaces_get_one_whole_version(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({f"t{i}": torch.full((1 << 14,), 0.0) for i in range(16)}, path)
    stop = threading.Event()

    def saver():
        v = 1
        while not stop.is_set():
            save_file({f"t{i}": torch.full((1 << 14,), float(v)) for i in range(16)}, path)
            v += 1

    th = threading.Thread(target=saver)
    th.start()
    raised = []
    try:
        for _ in range(300):
            try:
                got = load_file(path)
            except errors.FastensorError as exc:
                assert isinstance(exc, OSError | ValueError), type(exc)
                raised.append(exc)
                continue
            first = next(iter(got.values()))[0].item()
            assert all_equal(got, first), "a load mixed two versions"
    finally:
        stop.set()
        th.join()
    assert len(raised) <= 3, raised[:3]
