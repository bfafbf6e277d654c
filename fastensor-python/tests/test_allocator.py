"""fastensor.torch.caching_allocator: torch's large CPU tensors served from a pool of reused
blocks (libc10's allocation calls redirected), as a PyTorch user runs it."""

from __future__ import annotations

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

    return _native.torch_allocator_block(t.untyped_storage().data_ptr()) is not None


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
        assert after["hits"] >= before["hits"] + 1
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
        misses = allocator_stats()["misses"]
        for _ in range(3):
            model(x).square().mean().backward()
        s = allocator_stats()
    assert s["misses"] == misses, "later steps reused the first steps' blocks"
    assert s["hits"] > 0
    assert s["live_bytes"] + s["idle_bytes"] <= s["peak_live_bytes"] * 3 // 2


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
    s = allocator_stats()
    assert s["idle_bytes"] == 0
    assert s["peak_live_bytes"] == s["live_bytes"]


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


def test_the_environment_switch_turns_it_off():
    code = (
        "import torch; from fastensor.torch import caching_allocator, allocator_stats\n"
        "with caching_allocator() as ca:\n"
        "    t = torch.empty(1 << 22)\n"
        "print(ca.enabled, ca.reason, allocator_stats()['installed'])\n"
    )
    env = dict(os.environ, FASTENSOR_TORCH_ALLOCATOR="0")
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
        with offload(dir=tmp_path, budget_bytes=8 * MIB, min_bytes=256 << 10) as stats:
            loss = model(x).sum()
        loss.backward()
        for p, r in zip(model.parameters(), ref, strict=True):
            assert torch.equal(p.grad, r)
    assert stats.caching_allocator
    assert stats.tensors_offloaded > 0
    # The block's graphs are gone: the session no longer holds the pool enabled.
    assert not allocator_stats()["enabled"]


def test_offload_without_the_pool_falls_back(tmp_path):
    x = torch.randn(1000, 512, requires_grad=True)
    with offload(dir=tmp_path, budget_bytes=8 * MIB, caching_allocator=False) as stats:
        y = (x * 2).exp().sum()
    y.backward()
    assert not stats.caching_allocator
    assert "caching_allocator=False" in stats.as_dict()["caching_allocator_reason"]
    assert torch.allclose(x.grad, 2 * (2 * x.detach()).exp())


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
