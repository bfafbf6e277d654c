"""fastensor.torch.caching_allocator: torch's large CPU tensors served from fastensor's host
pool (through torch's CPU allocator slot while in use, torch's own allocator put back when
the last user has left), as a PyTorch user runs it; offload uses it by default."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import pytest
import torch
from fastensor.torch import allocator_stats, caching_allocator, empty_cache, offload
from torch import nn

MIB = 1 << 20


def _in_pool(t: torch.Tensor) -> bool:
    from fastensor import _native

    whole = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return _native.torch_allocator_block(whole) is not None


def test_large_tensors_come_from_the_pool_and_their_memory_is_reused():
    with caching_allocator(min_bytes=MIB) as ca:
        assert ca.enabled, ca.reason
        before = allocator_stats()
        a = torch.full((MIB,), 3.0)  # 4 MiB
        assert _in_pool(a)
        assert a.untyped_storage().data_ptr() % 4096 == 0
        address = a.data_ptr()
        del a
        b = torch.empty(MIB)  # the same size: the block just freed
        assert b.data_ptr() == address
        small = torch.ones(1000)  # below min_bytes: glibc's
        assert not _in_pool(small)
        after = allocator_stats()
        assert after["reused"] >= before["reused"] + 1
        assert after["enabled"] and after["min_bytes"] == MIB
        b.fill_(2.0)
        assert float(b.sum()) == 2.0 * MIB
        del b
    # Disabled: torch allocates from glibc again; a block freed now still goes back.
    c = torch.empty(MIB)
    assert not _in_pool(c)
    assert not allocator_stats()["enabled"]


def test_training_steps_stop_taking_new_memory():
    torch.manual_seed(0)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)) for _ in range(4)]
    )
    x = torch.randn(512, 256)
    with caching_allocator(min_bytes=256 << 10):
        for _ in range(2):  # the first allocates the gradients, the second accumulates
            model(x).square().mean().backward()
        fresh = allocator_stats()["fresh_bytes"]
        for _ in range(3):
            model(x).square().mean().backward()
        s = allocator_stats()
    assert s["fresh_bytes"] == fresh, "later steps reused the first steps' memory"
    assert s["reused"] > 0
    assert s["live_bytes"] + s["idle_bytes"] <= s["peak_bytes"]


def test_gradients_are_identical_with_and_without_the_pool():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(128, 2048), nn.Tanh(), nn.Linear(2048, 64))
    x = torch.randn(300, 128)

    def grads():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    with caching_allocator(min_bytes=64 << 10):
        pooled = grads()
        pooled_again = grads()  # on reused (stale) blocks
    for a, b, c in zip(plain, pooled, pooled_again, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_empty_cache_releases_the_idle_blocks():
    with caching_allocator(min_bytes=MIB):
        t = torch.empty(4 * MIB)
        del t
    assert allocator_stats()["idle_bytes"] >= 16 * MIB
    released = empty_cache()
    assert released >= 16 * MIB
    assert allocator_stats()["idle_bytes"] == 0


def test_nested_uses_keep_the_smallest_threshold_until_the_last_ends():
    with caching_allocator(min_bytes=4 * MIB):
        with caching_allocator(min_bytes=MIB):
            assert allocator_stats()["min_bytes"] == MIB
        assert allocator_stats()["min_bytes"] == 4 * MIB
        assert not _in_pool(torch.empty(MIB // 2))  # 2 MiB < 4 MiB
    assert allocator_stats()["min_bytes"] is None
    with pytest.raises(ValueError):
        caching_allocator(min_bytes=0)


def _child_allocates(queue):
    # No parallel kernels: OpenMP does not survive a fork of a process that used it.
    t = torch.empty(MIB)
    t[0], t[-1] = 1.0, 2.0
    queue.put((_in_pool(t), float(t[0] + t[-1])))


def test_a_forked_child_allocates_while_the_parent_uses_the_pool():
    ctx = multiprocessing.get_context("fork")
    with caching_allocator(min_bytes=MIB):
        keep = torch.empty(MIB)
        queue = ctx.Queue()
        p = ctx.Process(target=_child_allocates, args=(queue,))
        p.start()
        in_pool, total = queue.get(timeout=60)
        p.join(60)
        del keep
    assert p.exitcode == 0
    assert in_pool and total == 3.0


@pytest.mark.parametrize("value", ["0", " Off ", "no", "FALSE"])
def test_the_environment_switch_turns_it_off(value):
    code = (
        "import torch; from fastensor.torch import caching_allocator, allocator_stats\n"
        "with caching_allocator() as ca:\n"
        "    t = torch.empty(1 << 22)\n"
        "print(ca.enabled, ca.reason, allocator_stats()['installed'])\n"
    )
    env = dict(os.environ, FASTENSOR_TORCH_ALLOCATOR=value)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False turned off by FASTENSOR_TORCH_ALLOCATOR False")


def test_offload_uses_the_pool_and_writes_pool_blocks_without_copies(tmp_path):
    torch.manual_seed(2)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(64, 1024), nn.GELU(), nn.Linear(1024, 64)) for _ in range(4)]
    )
    x = torch.randn(1000, 64)
    model(x).sum().backward()
    ref = [p.grad.clone() for p in model.parameters()]
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        with offload(
            dir=tmp_path, budget_bytes=8 * MIB, min_bytes=256 << 10, caching_allocator=True
        ) as stats:
            loss = model(x).sum()
        loss.backward()
        for p, r in zip(model.parameters(), ref, strict=True):
            assert torch.equal(p.grad, r)
    assert stats.caching_allocator
    assert stats.tensors_offloaded > 0
    # The block's graphs are gone: the session no longer holds the pool enabled.
    assert not allocator_stats()["enabled"]


def test_offload_serves_torch_from_the_pool_unless_asked_not_to_and_leaves_malloc_alone(
    tmp_path, monkeypatch
):
    from fastensor import _allocator

    calls: list = []
    monkeypatch.setattr(_allocator._native, "set_mmap_threshold", lambda t: calls.append(t) or True)
    monkeypatch.setattr(_allocator, "_mmap_threshold", None)
    x = torch.randn(1000, 512, requires_grad=True)
    with offload(dir=tmp_path, budget_bytes=8 * MIB) as stats:
        assert _in_pool(x * 3), "by default torch's large tensors come from the pool"
        y = (x * 2).exp().sum()
    y.backward()
    assert stats.caching_allocator
    with offload(dir=tmp_path, budget_bytes=8 * MIB, caching_allocator=False) as stats:
        assert not _in_pool(x * 3)
        y = (x * 2).exp().sum()
    x.grad = None
    y.backward()
    assert not stats.caching_allocator
    assert "caching_allocator=False" in stats.as_dict()["caching_allocator_reason"]
    assert torch.allclose(x.grad, 2 * (2 * x.detach()).exp())
    assert calls == [], "no mallopt behind the caller's back"
    # Asked for explicitly (and the pool not in use), the mmap threshold is set.
    with offload(dir=tmp_path, budget_bytes=8 * MIB, caching_allocator=False, release_memory=True):
        pass
    assert calls == [MIB]


def _run_python(code: str) -> dict:
    """Runs ``code`` in a fresh interpreter (a process whose allocator no test touched) and
    returns the JSON it prints last."""
    env = {k: v for k, v in os.environ.items() if k != "FASTENSOR_TORCH_ALLOCATOR"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


_PROBE = """
import gc, json
import torch
from fastensor import _native
from fastensor.torch import allocator_stats, caching_allocator, offload

def in_pool(t):
    whole = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return _native.torch_allocator_block(whole) is not None

def stats():
    s = allocator_stats()
    return {k: s[k] for k in ("installed", "enabled", "installs", "removals", "blocks_held")}

out = {"start": stats()}
"""


def test_torch_gets_its_own_allocator_back_when_the_last_user_leaves():
    code = _PROBE + (
        "with caching_allocator(min_bytes=1 << 20) as ca:\n"
        "    out['enabled'] = ca.enabled\n"
        "    out['during'] = stats()\n"
        "    kept = torch.full((1 << 20,), 2.0)\n"
        "    out['kept_in_pool'] = in_pool(kept)\n"
        "out['left'] = stats()\n"
        "fresh = torch.empty(1 << 20)\n"
        "out['fresh_in_pool'] = in_pool(fresh)\n"
        "del fresh\n"
        "out['kept_sum'] = float(kept.sum())\n"
        "del kept\n"
        "gc.collect()\n"
        "out['freed'] = stats()\n"
        "with caching_allocator(min_bytes=1 << 20):\n"
        "    out['again'] = stats()\n"
        "    t = torch.empty(1 << 20)\n"
        "    out['again_in_pool'] = in_pool(t)\n"
        "    del t\n"
        "out['end'] = stats()\n"
        "print(json.dumps(out))\n"
    )
    out = _run_python(code)
    assert out["start"] == {
        "installed": False,
        "enabled": False,
        "installs": 0,
        "removals": 0,
        "blocks_held": 0,
    }
    assert out["enabled"]
    assert out["during"]["installed"] and out["during"]["installs"] == 1
    # The last user left with a pool block still held: torch has its own allocator back at
    # once (new tensors are not the pool's), and the block comes back to the pool when freed.
    assert out["kept_in_pool"]
    assert not out["left"]["installed"] and not out["left"]["enabled"]
    assert out["left"]["removals"] == 1 and out["left"]["blocks_held"] == 1
    assert not out["fresh_in_pool"]
    assert out["kept_sum"] == 2.0 * (1 << 20)
    assert out["freed"]["blocks_held"] == 0
    # Enabled again, it is installed again, and removed again.
    assert out["again"]["installed"] and out["again"]["installs"] == 2
    assert out["again_in_pool"]
    assert out["end"] == {
        "installed": False,
        "enabled": False,
        "installs": 2,
        "removals": 2,
        "blocks_held": 0,
    }


def test_an_offload_session_and_a_block_share_the_pool_until_both_are_gone(tmp_path):
    code = _PROBE + (
        "from torch import nn\n"
        "model = nn.Sequential(nn.Linear(64, 1024), nn.GELU(), nn.Linear(1024, 64))\n"
        "x = torch.randn(1000, 64)\n"
        "with caching_allocator(min_bytes=256 << 10):\n"
        f"    with offload(dir={str(tmp_path)!r}, min_bytes=256 << 10) as st:\n"
        "        loss = model(x).sum()\n"
        "    out['inside'] = stats()\n"
        "out['graph_alive'] = stats()\n"
        "loss.backward()\n"
        "del loss\n"
        "gc.collect()\n"
        "out['used_pool'] = st.caching_allocator\n"
        "out['offloaded'] = st.tensors_offloaded\n"
        "out['after_backward'] = stats()\n"
        "model.zero_grad(set_to_none=True)\n"
        "gc.collect()\n"
        "out['end'] = stats()\n"
        "print(json.dumps(out))\n"
    )
    out = _run_python(code)
    assert out["used_pool"] and out["offloaded"] > 0
    assert out["inside"]["enabled"] and out["inside"]["installs"] == 1
    # The block has ended; the session still holds the pool enabled for its graph.
    assert out["graph_alive"]["enabled"] and out["graph_alive"]["installed"]
    assert not out["after_backward"]["enabled"]
    assert out["end"] == {
        "installed": False,
        "enabled": False,
        "installs": 1,
        "removals": 1,
        "blocks_held": 0,
    }


def test_without_libc10_enabling_is_refused_naming_it():
    code = (
        "import json, sys\n"
        "from fastensor import _native\n"
        "assert 'torch' not in sys.modules\n"
        "try:\n"
        "    _native.torch_allocator_enable(1 << 20)\n"
        "    print(json.dumps({'error': None}))\n"
        "except RuntimeError as e:\n"
        "    s = _native.torch_allocator_stats()\n"
        "    print(json.dumps({'error': str(e), 'installed': s['installed']}))\n"
    )
    out = _run_python(code)
    assert "libc10.so" in out["error"] and not out["installed"]


def test_common_tensor_operations_on_pool_memory(tmp_path):
    import io

    import numpy as np

    live_before = allocator_stats()["live_bytes"]
    with caching_allocator(min_bytes=64 << 10):
        a = torch.randn(256, 512)
        assert _in_pool(a)
        # numpy shares the pool block; the tensor keeps it alive.
        n = a.numpy()
        n[0, 0] = 7.0
        assert a[0, 0] == 7.0
        del n
        # torch.save / torch.load round trip (the loaded storages come from the pool too).
        buf = io.BytesIO()
        torch.save({"a": a, "b": a[1:].clone()}, buf)
        buf.seek(0)
        back = torch.load(buf)
        assert torch.equal(back["a"], a) and torch.equal(back["b"], a[1:])
        path = tmp_path / "t.pt"
        torch.save(a, path)
        assert torch.equal(torch.load(path, mmap=True), a)
        # Resizing a pool-backed tensor moves it to a new block and frees the old one.
        c = a.clone()
        c.resize_(512, 512)
        assert torch.equal(c[:256], a)
        s = a.clone().untyped_storage()
        s.resize_(s.nbytes() * 2)
        # Kernels of every kind on pool memory.
        assert torch.allclose((a @ a.T).diagonal(), (a * a).sum(1), rtol=1e-4, atol=1e-3)
        assert torch.equal(torch.cat([a, a]).view(2, 256, 512)[1], a)
        assert torch.equal(a.sort(dim=1).values, torch.from_numpy(np.sort(a.numpy(), axis=1)))
        f = torch.fft.rfft(a)
        assert f.shape == (256, 257)
        del a, back, c, s, f
    assert allocator_stats()["live_bytes"] == live_before, "every block came back"


def test_mkldnn_tensors_made_in_the_window_and_freed_after_it_never_reach_glibc(tmp_path):
    # ideep allocates through torch's `raw_allocate` and frees through the `raw_deleter` of
    # whichever allocator holds the slot at the free: a pool block made inside the window and
    # freed after it must not reach glibc's `free` (SIGABRT: munmap_chunk(): invalid pointer),
    # nor memory of torch's own made before the window and freed inside it the pool.
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no MKLDNN")
    code = _PROBE + (
        "from torch import nn\n"
        "lin = nn.Linear(256, 256)\n"
        "for i in range(100):\n"
        "    before = torch.randn(512, 512).to_mkldnn()\n"
        f"    with offload(dir={str(tmp_path)!r}, min_bytes=256 << 10):\n"
        "        made = torch.randn(1024, 1024).to_mkldnn()\n"
        "        twice = (made.to_dense() * 2).to_mkldnn()\n"
        "        del before\n"
        "        with caching_allocator(min_bytes=64 << 10):\n"
        "            inner = torch.randn(256, 1024).to_mkldnn()\n"
        "    gc.collect()\n"
        "    if i == 0:\n"
        "        out['after_window'] = stats()\n"
        "    out_sum = float(made.to_dense().sum() * 2 - twice.to_dense().sum())\n"
        "    assert abs(out_sum) < 1e-1, out_sum\n"
        "    del made, twice, inner\n"
        "    gc.collect()\n"
        "out['end'] = stats()\n"
        "print(json.dumps(out))\n"
    )
    out = _run_python(code)
    assert not out["after_window"]["enabled"] and not out["after_window"]["installed"]
    assert out["end"]["blocks_held"] == 0
    assert not out["end"]["installed"] and out["end"]["installs"] == out["end"]["removals"]
