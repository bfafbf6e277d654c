"""fastensor.torch as a PyTorch user calls it: round trips, resume into a real model,
selective and lazy reads, asynchronous saves."""

import os
import threading

import fastensor
import pytest
import torch
from conftest import leftovers
from fastensor.torch import (
    LoadResult,
    load_file,
    load_into,
    load_selected,
    safe_open,
    save_file,
    save_file_async,
)

INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
EXTRA_DTYPES = [
    getattr(torch, n)
    for n in ("float8_e5m2", "float8_e4m3fn", "uint16", "uint32", "uint64")
    if hasattr(torch, n)
]


def sample(dtype: torch.dtype, shape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    info_max = 100
    return torch.randint(0, info_max, shape, generator=g).to(dtype)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    # Bit for bit (NaN-safe, every dtype): compare the raw bytes.
    assert a.contiguous().reshape(-1).view(torch.uint8).tolist() == (
        b.contiguous().reshape(-1).view(torch.uint8).tolist()
    )


@pytest.mark.parametrize("dtype", [torch.bool, *INT_DTYPES, *FLOAT_DTYPES, *EXTRA_DTYPES])
def test_every_dtype_round_trips_bit_exact(tmp_path, dtype):
    t = {"x": sample(dtype, (7, 5)), "scalar": sample(dtype, ()), "empty": sample(dtype, (0, 3))}
    path = tmp_path / "m.safetensors"
    save_file(t, path)
    back = load_file(path)
    assert list(back) == list(t)
    for k in t:
        assert_same(back[k], t[k])


def test_large_tensors_at_odd_offsets_round_trip(tmp_path):
    # An odd-sized tensor first puts the next ones at unaligned file offsets.
    t = {
        "odd": torch.arange(3, dtype=torch.uint8),
        "big": sample(torch.float32, (3 << 18,)),  # 3 MiB
        "big16": sample(torch.float16, (1 << 20,)),
        "tail": sample(torch.int64, (17,)),
    }
    path = tmp_path / "big.safetensors"
    save_file(t, path)
    back = load_file(path)
    for k in t:
        assert_same(back[k], t[k])
    assert all(v.is_contiguous() for v in back.values())


def test_non_contiguous_inputs_are_saved_as_their_values(tmp_path):
    base, other = sample(torch.float32, (64, 48)), sample(torch.float32, (64, 48))
    t = {"t": base.t(), "strided": other[::3, 1::2], "expanded": torch.ones(4, 1).expand(4, 6)}
    save_file(t, tmp_path / "nc.safetensors")
    back = load_file(tmp_path / "nc.safetensors")
    for k in t:
        assert torch.equal(back[k], t[k])
        assert back[k].is_contiguous()


def test_loaded_tensors_own_their_memory(tmp_path):
    t = {"a": sample(torch.float32, (1 << 19,)), "b": sample(torch.float32, (1 << 19,))}
    save_file(t, tmp_path / "m.safetensors")
    back = load_file(tmp_path / "m.safetensors")
    a, b = back["a"], back["b"]
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    a.add_(1)  # writable, independent
    assert torch.equal(b, t["b"])
    del back, b
    assert torch.equal(a, t["a"] + 1)


def test_metadata_round_trips_and_is_none_without(tmp_path):
    save_file(
        {"a": torch.zeros(2)}, tmp_path / "m.safetensors", metadata={"format": "pt", "k": "v"}
    )
    with safe_open(tmp_path / "m.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt", "k": "v"}
    save_file({"a": torch.zeros(2)}, tmp_path / "n.safetensors")
    with safe_open(tmp_path / "n.safetensors", framework="pt") as f:
        assert f.metadata() is None


def test_safe_open_reads_on_demand(tmp_path):
    t = {f"w{i}": sample(torch.float32, (i + 1, 3), seed=i) for i in range(5)}
    save_file(t, tmp_path / "m.safetensors")
    with safe_open(tmp_path / "m.safetensors", framework="pt", device="cpu") as f:
        assert f.keys() == sorted(t) and f.offset_keys() == list(t)
        assert "w3" in f and len(f) == 5
        assert torch.equal(f.get_tensor("w3"), t["w3"])
        with pytest.raises(FileNotFoundError, match="w9"):
            f.get_tensor("w9")
    with pytest.raises(ValueError, match="closed"):
        f.get_tensor("w1")


def test_load_selected_reads_only_the_names_asked(tmp_path):
    t = {f"w{i}": sample(torch.float32, (100,), seed=i) for i in range(10)}
    save_file(t, tmp_path / "m.safetensors")
    got = load_selected(tmp_path / "m.safetensors", ["w7", "w2"])
    assert list(got) == ["w7", "w2"]
    assert torch.equal(got["w2"], t["w2"]) and torch.equal(got["w7"], t["w7"])
    with pytest.raises(FileNotFoundError, match="nope"):
        load_selected(tmp_path / "m.safetensors", ["w1", "nope"])


class TinyTransformer(torch.nn.Module):
    def __init__(self, vocab=50, d=32, layers=2, tie=True):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        layer = torch.nn.TransformerEncoderLayer(
            d, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.register_buffer("steps", torch.tensor(7))
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(self.norm(self.blocks(self.embed(x))))


def test_load_into_a_module_equals_load_state_dict(tmp_path):
    torch.manual_seed(0)
    trained = TinyTransformer()
    path = tmp_path / "model.safetensors"
    sd = {k: v for k, v in trained.state_dict().items() if k != "head.weight"}  # tied
    save_file(sd, path)

    torch.manual_seed(1)
    ours, ref = TinyTransformer(), TinyTransformer()
    result = load_into(ours, path, strict=False)
    ref.load_state_dict(load_file(path), strict=False)
    assert isinstance(result, LoadResult)
    assert result.missing_keys == ["head.weight"] and result.unexpected_keys == []
    for (k, a), (_, b) in zip(ours.state_dict().items(), ref.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    x = torch.randint(0, 50, (2, 9))
    ours.eval(), trained.eval()
    assert torch.equal(ours(x), trained(x))
    assert ours.head.weight.data_ptr() == ours.embed.weight.data_ptr()  # still tied


def test_load_into_fills_the_existing_tensors_in_place(tmp_path):
    t = {"a": sample(torch.float32, (1 << 18,)), "b": sample(torch.int64, (33,))}
    save_file(t, tmp_path / "m.safetensors")
    dst = {"a": torch.zeros(1 << 18), "b": torch.zeros(33, dtype=torch.int64)}
    ptrs = {k: v.data_ptr() for k, v in dst.items()}
    assert load_into(dst, tmp_path / "m.safetensors") == LoadResult([], [])
    for k in t:
        assert torch.equal(dst[k], t[k]) and dst[k].data_ptr() == ptrs[k]


def test_load_into_casts_and_fills_non_contiguous_destinations(tmp_path):
    t = {"w": sample(torch.float32, (8, 6)), "v": sample(torch.float32, (5,))}
    save_file(t, tmp_path / "m.safetensors")
    w_dst = torch.zeros(6, 8).t()  # non-contiguous view
    v_dst = torch.zeros(5, dtype=torch.float64)  # another dtype: cast, as load_state_dict does
    load_into({"w": w_dst, "v": v_dst}, tmp_path / "m.safetensors")
    assert torch.equal(w_dst, t["w"])
    assert torch.equal(v_dst, t["v"].double())


def test_strict_load_into_reports_names_and_changes_nothing(tmp_path):
    save_file({"a": torch.ones(3), "extra": torch.ones(1)}, tmp_path / "m.safetensors")
    dst = {"a": torch.zeros(3), "missing": torch.zeros(2)}
    with pytest.raises(RuntimeError) as err:
        load_into(dst, tmp_path / "m.safetensors")
    assert '"missing"' in str(err.value) and '"extra"' in str(err.value)
    assert torch.equal(dst["a"], torch.zeros(3))  # nothing was read
    result = load_into(dst, tmp_path / "m.safetensors", strict=False)
    assert result == LoadResult(["missing"], ["extra"])
    assert torch.equal(dst["a"], torch.ones(3))


def test_load_into_refuses_a_shape_mismatch(tmp_path):
    save_file({"a": torch.ones(3)}, tmp_path / "m.safetensors")
    dst = {"a": torch.zeros(4)}
    with pytest.raises(RuntimeError, match="size mismatch for a"):
        load_into(dst, tmp_path / "m.safetensors")
    assert torch.equal(dst["a"], torch.zeros(4))


def test_resume_a_training_run(tmp_path):
    torch.manual_seed(0)
    model = TinyTransformer(tie=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randint(0, 50, (4, 9)), torch.randint(0, 50, (4, 9))

    def step(m, o):
        o.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())
        loss.backward()
        o.step()
        return loss.item()

    step(model, opt)
    save_file(model.state_dict(), tmp_path / "ckpt.safetensors")
    expected = step(model, torch.optim.SGD(model.parameters(), lr=0.1))

    torch.manual_seed(5)
    resumed = TinyTransformer(tie=False)
    load_into(resumed, tmp_path / "ckpt.safetensors")
    assert step(resumed, torch.optim.SGD(resumed.parameters(), lr=0.1)) == expected


def test_async_save_snapshots_before_returning(tmp_path):
    t = {"w": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(10)}
    expected = {k: v.clone() for k, v in t.items()}
    handle = save_file_async(t, tmp_path / "a.safetensors", metadata={"step": "1"})
    for v in t.values():  # the training loop goes on at once
        v.mul_(-1)
    handle.wait()
    assert handle.done()
    back = load_file(tmp_path / "a.safetensors")
    for k in t:
        assert torch.equal(back[k], expected[k])
    with safe_open(tmp_path / "a.safetensors", "pt") as f:
        assert f.metadata() == {"step": "1"}


def test_async_save_reuses_staging_and_reports_errors_on_wait(tmp_path, engine):
    t = {"w": torch.ones(1 << 18)}
    save_file_async(t, tmp_path / "a.safetensors", engine=engine).wait()
    kept = engine.staging_bytes
    assert kept >= 1 << 20
    save_file_async(t, tmp_path / "b.safetensors", engine=engine).wait()
    assert engine.staging_bytes == kept
    handle = save_file_async(t, tmp_path / "no-such-dir" / "c.safetensors", engine=engine)
    with pytest.raises(fastensor.FastensorError) as err:
        handle.wait()
    assert "no-such-dir" in str(err.value)
    with pytest.raises(fastensor.FastensorError):  # raised again, same error
        handle.wait()
    engine.release_staging()
    assert engine.staging_bytes == 0


def test_a_failed_save_leaves_the_old_file_and_nothing_else(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(4)}, path)
    before = path.read_bytes()
    with pytest.raises(TypeError):
        save_file({"a": torch.ones(4), "b": "not a tensor"}, path)
    with pytest.raises(ValueError):
        save_file({"c": torch.ones(2, dtype=torch.complex128)}, path)
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_engine_choice_and_report(tmp_path):
    eng = fastensor.Engine(backends=["posix"])
    assert eng.backend_names() == ["posix"]
    save_file({"a": torch.ones(1000)}, tmp_path / "m.safetensors", engine=eng)
    assert torch.equal(load_file(tmp_path / "m.safetensors", engine=eng)["a"], torch.ones(1000))
    assert "posix" in eng.report()
    with pytest.raises(fastensor.FastensorError):
        fastensor.Engine(backends=["no-such-backend"])
    eng2 = fastensor.Engine(pin="posix")
    assert eng2.pinned == "posix"
    eng2.pin(None)
    assert eng2.pinned is None


def test_backends_lists_what_runs_here():
    names = {b.name: b for b in fastensor.backends()}
    assert names["posix"].available
    for b in names.values():
        assert b.available or b.detail  # an unavailable backend says why


def test_transfers_release_the_gil(tmp_path):
    t = {"w": torch.randn(32 << 20 // 4)}  # 32 MiB
    path = tmp_path / "m.safetensors"
    eng = fastensor.Engine(pin="posix-direct")
    save_file(t, path, engine=eng)
    ticks = 0
    stop = threading.Event()
    started = threading.Event()

    def count():
        nonlocal ticks
        started.set()
        while not stop.is_set():
            ticks += 1

    file = eng._native.open(os.fspath(path))
    dst = torch.empty_like(t["w"])
    th = threading.Thread(target=count)
    th.start()
    started.wait()
    try:
        # Only the native read runs between the two readings: a call holding the GIL would
        # let the counting thread run not once. A few tries: on a busy machine the counting
        # thread may not get a core during one short read.
        for _ in range(5):
            before = ticks
            file.read_into([("w", dst.view(torch.uint8), 0, dst.numel() * 4)])
            during = ticks - before
            if during > 0:
                break
    finally:
        stop.set()
        th.join()
    assert torch.equal(dst, t["w"])
    assert during > 0


def test_cuda_requests_fail_clearly_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    save_file({"a": torch.ones(2)}, tmp_path / "m.safetensors")
    with pytest.raises((RuntimeError, AssertionError)):
        load_file(tmp_path / "m.safetensors", device="cuda:0")


def test_paths_may_be_str_or_pathlike(tmp_path):
    save_file({"a": torch.ones(2)}, str(tmp_path / "s.safetensors"))
    assert "a" in load_file(os.fspath(tmp_path / "s.safetensors"))
    with pytest.raises(TypeError, match="path"):
        load_file(42)
