"""fastensor.torch.offload: activation offload over saved_tensors_hooks, on real modules.

Every comparison is bit-exact (torch.equal) against the same computation without offload.
"""

from __future__ import annotations

import copy
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

os.environ.setdefault("FASTENSOR_PROFILE", "")

torch = pytest.importorskip("torch")
nn = torch.nn

from fastensor.torch import offload  # noqa: E402

MIB = 1 << 20


def swap_files(directory) -> list[str]:
    """The swap files this process holds in ``directory`` (they have no name on disk: open
    descriptors of unnamed files there), and any file left there by name."""
    directory = os.path.realpath(directory)
    held = set()  # one per file, however many descriptors its backends opened
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(" (deleted)") and os.path.dirname(target) == directory:
            held.add(target)
    return sorted(held) + sorted(os.listdir(directory))


def grads_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a: nn.Module, b: nn.Module) -> None:
    ga, gb = grads_of(a), grads_of(b)
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        assert torch.equal(ga[n], gb[n]), f"gradient of {n} differs"


def transformer(d: int = 128, blocks: int = 3) -> nn.Module:
    torch.manual_seed(0)
    layers = [
        nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, dropout=0.1, batch_first=True)
        for _ in range(blocks)
    ]
    return nn.Sequential(*layers, nn.Linear(d, 10))


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.GELU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(64 * 8 * 8, 10),
    )


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, **kw) -> tuple[torch.Tensor, object]:
    """One forward (inside offload when ``kw`` is given) and backward; the loss and stats."""
    torch.manual_seed(1)  # the same dropout masks in both runs
    stats = None
    if kw:
        with offload(**kw) as stats:
            out = model(x)
            loss = nn.functional.cross_entropy(out.reshape(-1, 10), y.reshape(-1))
    else:
        out = model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, 10), y.reshape(-1))
    loss.backward()
    return loss.detach(), stats


@pytest.mark.parametrize("pack", [True, False])
def test_dropout_masks_cross_to_disk_packed_with_gradients_bit_identical(tmp_path, pack):
    # torch's CPU dropout saves its mask as a float tensor of 0 and 1/(1-p): packed, it
    # crosses to the swap file as a bitmap and comes back bit for bit.
    ref = transformer(d=128, blocks=4)
    off = copy.deepcopy(ref)
    torch.manual_seed(2)
    x = torch.randn(16, 64, 128)
    y = torch.randint(0, 10, (16, 64))
    loss_ref, _ = step(ref, x, y)
    loss_off, stats = step(
        off, x, y, dir=tmp_path, budget_bytes=2 * MIB, min_bytes=64 << 10, pack=pack
    )
    assert torch.equal(loss_ref, loss_off)
    assert_same_grads(ref, off)
    assert stats.bytes_written > 16 * MIB and stats.bytes_read > 8 * MIB
    if pack:
        # The masks are about a quarter of what a layer saves.
        assert stats.file_bytes_written < 0.85 * stats.bytes_written, stats.as_dict()
        assert stats.file_bytes_read < 0.9 * stats.bytes_read, stats.as_dict()
    else:
        assert stats.file_bytes_written >= stats.bytes_written
        assert stats.file_bytes_read >= stats.bytes_read


@pytest.mark.parametrize("prefetch", [None, 0, 2])
def test_transformer_gradients_bit_identical(tmp_path, prefetch):
    ref = transformer()
    off = copy.deepcopy(ref)
    torch.manual_seed(2)
    x = torch.randn(8, 64, 128)
    y = torch.randint(0, 10, (8, 64))
    loss_ref, _ = step(ref, x, y)
    budget = 2 * MIB
    loss_off, stats = step(
        off, x, y, dir=tmp_path, budget_bytes=budget, min_bytes=64 << 10, prefetch=prefetch
    )
    assert torch.equal(loss_ref, loss_off)
    assert_same_grads(ref, off)
    assert stats.tensors_offloaded >= 12
    # Everything is written but what was still waiting for its write when backward took it
    # from its own memory (at most the budget's worth, pending when the forward pass ended).
    assert stats.bytes_offloaded > 8 * MIB
    assert stats.bytes_offloaded - budget <= stats.bytes_written <= stats.bytes_offloaded
    # each storage read back at most once (not at all when backward came before its write
    # ended: then it is answered from memory)
    assert 0 < stats.bytes_read <= stats.bytes_written
    assert 0 < stats.peak_held_bytes <= budget
    if prefetch == 0:
        assert stats.prefetches == 0
    else:
        assert stats.prefetches > 0
    del loss_off
    gc.collect()
    assert swap_files(tmp_path) == []
    assert stats.held_bytes == 0


def test_cnn_gradients_bit_identical_and_masks_offloaded(tmp_path):
    ref = cnn()
    off = copy.deepcopy(ref)
    torch.manual_seed(3)
    x = torch.randn(32, 3, 32, 32)
    y = torch.randint(0, 10, (32,))
    loss_ref, _ = step(ref, x, y)
    loss_off, stats = step(off, x, y, dir=tmp_path, budget_bytes=4 * MIB, min_bytes=256 << 10)
    assert torch.equal(loss_ref, loss_off)
    assert_same_grads(ref, off)
    for a, b in zip(ref.modules(), off.modules(), strict=True):
        if isinstance(a, nn.BatchNorm2d):
            assert torch.equal(a.running_mean, b.running_mean)
    # conv inputs, batch-norm outputs, max-pool indices (int64, no grad) all went out
    assert stats.tensors_offloaded >= 8
    assert stats.peak_held_bytes <= 4 * MIB
    gc.collect()
    assert swap_files(tmp_path) == []


def test_parameters_and_small_tensors_stay(tmp_path):
    torch.manual_seed(0)
    lin = nn.Linear(1024, 1024)  # weight: 4 MiB, a leaf that requires grad
    x = torch.randn(512, 1024, requires_grad=True)  # a leaf input: 2 MiB
    with offload(dir=tmp_path, min_bytes=1 * MIB) as stats:
        h = lin(x)  # saves x (a leaf) and weight.t() (a view of a parameter)
        z = torch.tanh(h)  # saves its 2 MiB output
        small = z[:4].exp()  # saves a 16 KiB result
        loss = z.sum() + small.sum()
    assert stats.tensors_offloaded == 1
    assert stats.bytes_offloaded == z.untyped_storage().nbytes()
    assert stats.tensors_kept >= 3
    loss.backward()
    assert stats.bytes_read <= stats.bytes_offloaded


def test_same_tensor_saved_twice_is_written_once(tmp_path):
    a = torch.randn(512, 1024, requires_grad=True)
    with offload(dir=tmp_path, budget_bytes=8 * MIB) as stats:
        x = a.exp()  # saves its result x
        y = x * x  # saves x twice
        loss = y.sum()
    assert stats.tensors_offloaded == 1
    assert stats.saves_deduplicated == 2
    loss.backward()
    ref = a.detach().clone().requires_grad_()
    rx = ref.exp()
    (rx * rx).sum().backward()
    assert torch.equal(a.grad, ref.grad)
    assert stats.bytes_written <= 2 * MIB  # one write at most (none if backward came first)
    assert stats.bytes_read <= 2 * MIB  # read back at most once (not at all if still there)


def test_views_of_a_saved_tensor_share_one_write(tmp_path):
    a = torch.randn(1024, 1024, requires_grad=True)

    def f(a):
        x = a.exp()
        v1 = x[:, 100:900]  # a strided view with an offset
        v2 = x.t()  # a transposed view
        return v1.sin().sum() + v2.cos().sum() + (x[7] * 3).pow(2).sum()

    with offload(dir=tmp_path, budget_bytes=8 * MIB) as stats:
        loss = f(a)
    assert stats.tensors_offloaded == 1  # x's storage, written once for every view
    loss.backward()
    ref = a.detach().clone().requires_grad_()
    f(ref).backward()
    assert torch.equal(a.grad, ref.grad)
    assert stats.bytes_read <= 4 * MIB  # read back once at most, for all three views


class Check(torch.autograd.Function):
    """Saves its argument and checks in backward that it came back exactly."""

    @staticmethod
    def forward(ctx, anchor, saved, expect):
        ctx.save_for_backward(saved)
        ctx.expect = (expect.clone(), saved.dtype, saved.shape, saved.stride())
        ctx.offset = saved.storage_offset()
        return anchor * 2

    @staticmethod
    def backward(ctx, grad):
        (saved,) = ctx.saved_tensors
        value, dtype, shape, stride = ctx.expect
        assert saved.dtype == dtype and saved.shape == shape
        assert saved.stride() == stride and saved.storage_offset() == ctx.offset
        assert saved.layout == torch.strided
        assert torch.equal(saved, value)
        Check.seen += 1
        return grad * 2, None, None


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool]
)
def test_dtype_stride_and_offset_preserved(tmp_path, dtype):
    Check.seen = 0
    base = (torch.randn(640, 1024) * 10).to(dtype)  # 0.6-5 MiB
    views = [base, base.t(), base[3:600:2, 5:], base.reshape(1024, 640)[:, 1::3]]
    anchor = torch.ones(4, requires_grad=True)
    with offload(dir=tmp_path, min_bytes=1, budget_bytes=16 * MIB) as stats:
        outs = [Check.apply(anchor, v.clone() if i == 0 else v, v) for i, v in enumerate(views)]
        loss = sum(o.sum() for o in outs)
    assert stats.tensors_offloaded == 2  # the clone's storage and base's, for its three views
    loss.backward()
    assert Check.seen == 4
    assert torch.equal(anchor.grad, torch.full((4,), 8.0))


def test_retain_graph_unpacks_twice(tmp_path):
    ref = transformer(blocks=2)
    off = copy.deepcopy(ref)
    x = torch.randn(4, 64, 128)
    torch.manual_seed(5)
    loss_ref = ref(x).square().mean()
    loss_ref.backward(retain_graph=True)
    loss_ref.backward()
    torch.manual_seed(5)
    with offload(dir=tmp_path, budget_bytes=2 * MIB, min_bytes=64 << 10) as stats:
        loss_off = off(x).square().mean()
    loss_off.backward(retain_graph=True)
    assert swap_files(tmp_path) != []  # the graph is still alive
    first = stats.unpacks
    loss_off.backward()  # frees the graph
    assert torch.equal(loss_ref, loss_off)
    assert_same_grads(ref, off)
    assert stats.unpacks == 2 * first > 0
    gc.collect()
    assert swap_files(tmp_path) == []


def test_graph_freed_without_backward_releases_everything(tmp_path):
    model = transformer(blocks=2)
    x = torch.randn(4, 64, 128)
    with offload(dir=tmp_path, budget_bytes=2 * MIB, min_bytes=64 << 10) as stats:
        loss = model(x).sum()
    assert swap_files(tmp_path) != []
    assert stats.bytes_offloaded > 0
    del loss
    gc.collect()
    assert swap_files(tmp_path) == []
    # Only the read-ahead that starts when the block ends (at most the budget) was read.
    assert stats.held_bytes == 0 and stats.bytes_read <= 2 * MIB


def test_exception_inside_the_block(tmp_path):
    model = transformer(blocks=2)
    x = torch.randn(4, 64, 128)

    def run():
        with offload(dir=tmp_path, budget_bytes=2 * MIB, min_bytes=64 << 10) as stats:
            _ = model(x).sum()
            run.stats = stats
            raise KeyError("boom")

    with pytest.raises(KeyError):
        run()
    gc.collect()
    assert swap_files(tmp_path) == []
    # The hooks are gone: a forward after the block offloads nothing.
    before = run.stats.tensors_offloaded
    model(x).sum().backward()
    assert run.stats.tensors_offloaded == before > 0


def test_several_graphs_alive_at_once(tmp_path):
    ref = transformer(blocks=2)
    off = copy.deepcopy(ref)
    xs = [torch.randn(4, 64, 128) for _ in range(3)]
    torch.manual_seed(6)
    ref_losses = [ref(x).square().mean() for x in xs]
    for loss in reversed(ref_losses):
        loss.backward()
    torch.manual_seed(6)
    kw = {"dir": tmp_path, "budget_bytes": 2 * MIB, "min_bytes": 64 << 10}
    with offload(**kw) as s1:
        l0 = off(xs[0]).square().mean()
        l1 = off(xs[1]).square().mean()  # two graphs from one block
    with offload(**kw) as s2:
        l2 = off(xs[2]).square().mean()  # and one from another store
    assert len(swap_files(tmp_path)) == 2
    for loss in (l2, l1, l0):
        loss.backward()
    for a, b in zip(ref_losses, (l0, l1, l2), strict=True):
        assert torch.equal(a, b)
    assert_same_grads(ref, off)
    del l0, l1, l2
    gc.collect()
    assert swap_files(tmp_path) == []
    assert 0 < s1.bytes_read <= s1.bytes_written and 0 < s2.bytes_read <= s2.bytes_written


def test_budget_never_exceeded(tmp_path):
    torch.manual_seed(0)
    layers = nn.Sequential(
        *[nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)) for _ in range(12)]
    )
    x = torch.randn(1024, 256)
    budget = 9 * MIB  # two of the 4 MiB activations, a third waits
    with offload(dir=tmp_path, budget_bytes=budget, min_bytes=1 * MIB) as stats:
        loss = layers(x).square().mean()
    loss.backward()
    assert stats.bytes_offloaded >= 12 * 2 * 4 * MIB
    assert stats.peak_held_bytes <= budget
    assert stats.bytes_offloaded / budget > 10


def test_a_storage_larger_than_the_budget_is_written_through(tmp_path):
    a = torch.randn(1024, 1024, requires_grad=True)  # 4 MiB
    b = a.detach().clone().requires_grad_()
    with offload(dir=tmp_path, budget_bytes=1 * MIB) as stats:
        y = a.exp() * 2
    y.sum().backward()
    b.exp().mul(2).sum().backward()
    assert torch.equal(a.grad, b.grad)
    assert stats.written_through >= 1
    assert stats.peak_held_bytes <= 1 * MIB
    assert stats.bytes_read >= 4 * MIB


def test_bad_devices(tmp_path):
    meta = torch.empty(1024, 1024, device="meta", requires_grad=True)
    with pytest.raises(ValueError, match="meta"), offload(dir=tmp_path):
        meta.exp()
    with pytest.raises(ValueError):
        offload(budget_bytes=0)
    gc.collect()
    assert swap_files(tmp_path) == []


def run_offload_script(tmp_path, inside: str = "", after: str = "") -> subprocess.CompletedProcess:
    """Runs a new Python process that offloads ``a.exp()`` to ``tmp_path`` in a ``with
    offload(...) as stats`` block ending with ``inside``, then runs ``after``."""
    code = (
        textwrap.dedent(
            f"""
            import os, signal, torch
            from fastensor.torch import offload
            a = torch.randn(1024, 1024, requires_grad=True)
            with offload(dir={str(tmp_path)!r}) as stats:
                y = a.exp()
            """
        )
        + textwrap.indent(textwrap.dedent(inside), "    ")
        + textwrap.dedent(after)
    )
    env = dict(os.environ, FASTENSOR_PROFILE="")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_a_killed_process_leaves_no_swap_file(tmp_path):
    p = run_offload_script(
        tmp_path,
        """
        print(stats.swap_path, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    # The swap file had no name: the kill left nothing in the directory.
    assert os.listdir(tmp_path) == []
    a = torch.randn(1024, 1024, requires_grad=True)
    with offload(dir=tmp_path):
        a.exp().sum().backward()
    gc.collect()
    assert swap_files(tmp_path) == []


def test_swap_file_removed_when_the_process_exits_with_a_live_graph(tmp_path):
    # The process exits with the graph (and its store) alive.
    p = run_offload_script(tmp_path, after="raise SystemExit(3)\n")
    assert p.returncode == 3, p.stderr
    assert swap_files(tmp_path) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no usable CUDA device here")
def test_cuda_tensors_staged_through_pinned_memory(tmp_path):
    ref = transformer(blocks=2).cuda()
    off = copy.deepcopy(ref)
    x = torch.randn(4, 64, 128, device="cuda")
    torch.manual_seed(7)
    ref(x).square().mean().backward()
    torch.manual_seed(7)
    with offload(dir=tmp_path, budget_bytes=2 * MIB, min_bytes=64 << 10) as stats:
        loss = off(x).square().mean()
    loss.backward()
    assert stats.tensors_offloaded > 0
    assert_same_grads(ref, off)


def test_a_saved_tensor_still_in_memory_comes_back_without_a_read(tmp_path):
    x = torch.randn(512, 1024, requires_grad=True)
    with offload(dir=tmp_path, budget_bytes=8 * MIB, min_bytes=64 << 10) as stats:
        y = x.exp()  # exp saves its output, which the caller keeps
        loss = y.sum()
    loss.backward()
    assert stats.tensors_offloaded == 1
    assert stats.restored_in_place == 1
    assert torch.equal(x.grad, y.detach())
    del y, loss
    gc.collect()
    assert swap_files(tmp_path) == []


def test_a_saved_tensor_changed_in_place_since_comes_back_as_packed(tmp_path):
    x = torch.randn(512, 1024, requires_grad=True)
    # write_behind=0: written as soon as saved.
    with offload(dir=tmp_path, budget_bytes=8 * MIB, min_bytes=64 << 10, write_behind=0) as stats:
        y = x.exp()
        loss = y.sum()
    expected = y.detach().clone()
    deadline = time.monotonic() + 30
    while stats.bytes_written < stats.bytes_offloaded and time.monotonic() < deadline:
        time.sleep(0.01)  # once written, the packed bytes are on disk
    with torch.no_grad():
        y.add_(1.0)  # without offload autograd would refuse this; offload reads the packed bytes
    loss.backward()
    assert stats.restored_in_place == 0
    assert stats.bytes_read >= y.numel() * 4
    assert torch.equal(x.grad, expected)


def test_a_saved_tensor_changed_in_place_before_its_write_is_refused(tmp_path):
    x = torch.randn(512, 1024, requires_grad=True)
    with offload(dir=tmp_path, budget_bytes=8 * MIB, min_bytes=64 << 10) as stats:
        y = x.exp()
        loss = y.sum()
    assert stats.bytes_written == 0  # the last saved: left unwritten (write_behind)
    with torch.no_grad():
        y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_the_last_tensors_saved_are_never_written(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(16)])
    x = torch.randn(1024, 256)
    model(x).square().mean().backward()
    expected = grads_of(model)
    model.zero_grad()
    # Each layer saves 1 MiB; the budget holds 4 of them, 2 of them unwritten.
    with offload(dir=tmp_path, budget_bytes=4 * MIB, min_bytes=64 << 10) as stats:
        loss = model(x).square().mean()
    loss.backward()
    got = grads_of(model)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert stats.bytes_never_written >= 2 * MIB
    assert stats.bytes_written + stats.bytes_never_written <= stats.bytes_offloaded
    assert stats.bytes_written >= stats.bytes_offloaded - 4 * MIB


def test_two_forwards_in_one_block_write_the_first_ones_tail_when_the_second_needs_room(
    tmp_path,
):
    # Gradient accumulation: both micro-batches' graphs live in one block; the first's
    # unwritten tail must be written once the second's tensors need the room.
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])
    xs = [torch.randn(1024, 256) for _ in range(2)]
    sum(model(x).square().mean() for x in xs).backward()
    expected = grads_of(model)
    model.zero_grad()
    with offload(dir=tmp_path, budget_bytes=4 * MIB, min_bytes=64 << 10) as stats:
        losses = [model(x).square().mean() for x in xs]
    sum(losses).backward()
    got = grads_of(model)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert stats.bytes_written >= stats.bytes_offloaded - 4 * MIB
    assert stats.peak_held_bytes <= 4 * MIB


def _wait_written(stats, timeout: float = 30.0) -> None:
    """Waits until every offloaded byte is on disk (reading ``stats`` also lets the session
    see the writes finished)."""
    deadline = time.monotonic() + timeout
    while stats.bytes_written < stats.bytes_offloaded and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stats.bytes_written >= stats.bytes_offloaded


def test_a_base_changed_after_a_temporary_view_of_it_was_saved_comes_back_as_saved(tmp_path):
    # The saved tensor is a view nothing else keeps: the change is seen through its base,
    # which shares its version counter (autograd's own check is skipped under saved tensor
    # hooks). Its write was seen finished first: the gradient is the saved values'.
    a = torch.randn(1024, 1024)  # 4 MiB, needs no grad: offloaded
    b = torch.randn(1024 * 1024, requires_grad=True)
    saved = a.view(-1).clone()
    with offload(dir=tmp_path, budget_bytes=64 * MIB, write_behind=0) as stats:
        y = a.view(-1) * b
    _wait_written(stats)
    with torch.no_grad():
        a.add_(1.0)
    y.sum().backward()
    assert stats.tensors_offloaded == 1 and stats.restored_in_place == 0
    assert torch.equal(b.grad, saved)


@pytest.mark.parametrize("through_view", [False, True])
def test_a_tensor_changed_while_its_write_may_be_in_flight_raises_or_gives_the_saved_gradient(
    tmp_path, through_view
):
    # write_behind=0: the write starts at the pack and may still run while the tensor is
    # changed, reading the changed memory. Backward raises as autograd does, or (where the
    # write was seen finished before the change) gives the gradient of the values as saved;
    # never of the changed ones, nor of a mix.
    n = 32 << 20  # 128 MiB of float32
    outcomes = []
    for _ in range(3):
        a = torch.randn(n)
        b = torch.randn(n, requires_grad=True)
        saved = a.clone()
        with offload(dir=tmp_path, budget_bytes=1 << 30, write_behind=0):
            y = (a.view(1, -1).view(-1) if through_view else a) * b
        with torch.no_grad():
            a.add_(1.0)
        try:
            y.sum().backward()
        except RuntimeError as e:
            assert "modified by an inplace operation" in str(e)
            outcomes.append("raised")
        else:
            assert torch.equal(b.grad, saved), "the gradient of changed values"
            outcomes.append("saved")
        del a, b, y, saved
        gc.collect()
    assert outcomes


def test_closing_a_store_does_not_wait_holding_the_gil_for_a_put_in_another_thread(tmp_path):
    # A put waiting for room releases the GIL and needs it back to return; a close that waits
    # for that put while holding the GIL would hang (the interpreter's exit, say, closing the
    # store of a block whose pack runs in another thread).
    code = textwrap.dedent(
        f"""
        import threading, time
        import torch
        from fastensor import _native
        from fastensor._engine import engine_or_default

        store = _native.OffloadStore(
            engine_or_default(None), {os.fspath(tmp_path)!r}, 300 << 20, write_behind=0
        )
        big = [torch.ones(256 << 20, dtype=torch.uint8) for _ in range(2)]
        store.put(big[0], "first")  # written at once; its room comes back once written
        started = threading.Event()
        outcome = []

        def second():
            started.set()
            try:
                outcome.append(store.put(big[1], "second").nbytes)  # waits for the room
            except ValueError as e:
                outcome.append(str(e))

        t = threading.Thread(target=second)
        t.start()
        started.wait()
        time.sleep(0.02)
        store.close()
        t.join()
        assert store.closed and outcome, outcome
        print("closed", outcome)
        """
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("close() hung waiting for a put in another thread")
    assert out.returncode == 0, out.stderr
    assert "closed" in out.stdout
