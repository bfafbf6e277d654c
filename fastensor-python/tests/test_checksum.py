"""Checksums: saved with checksum=True (one metadata entry; the file stays plain
safetensors), checked by verify=True loads as the bytes arrive and by verify_file and the
CLI. A flipped byte in any tensor, a truncated shard and swapped tensors are each caught and
named."""

import json
import math
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import fastensor
import fastensor.numpy as fn
import fastensor.torch as ft
import numpy as np
import pytest
import safetensors.torch as st
import torch
from _indices import indices
from fastensor.errors import CorruptError
from hypothesis import given, settings
from hypothesis import strategies as hst

KEY = "fastensor.checksums"


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {f"layer.{i}.w": torch.randn(64 + i, 32, generator=g) for i in range(4)}
    out["big"] = torch.randn(1 << 20, generator=g)  # 4 MiB: read alone, not staged
    out["ids"] = torch.arange(10, dtype=torch.int64)
    out["empty"] = torch.empty(0, 3)
    return out


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def _range_of(path, name: str) -> tuple[int, int]:
    with ft.safe_open(path, framework="pt") as f:
        entry = f._entries[name]
    return entry[3], entry[3] + entry[4]


def _verified_loads(path):
    """Every verified way to read ``path``, each a callable."""
    return [
        lambda: ft.load_file(path, verify=True),
        lambda: ft.load_into(_tensors(), path, verify=True),
        lambda: ft.safe_open(path, framework="pt", verify=True).get_tensors(),
        lambda: fastensor.verify_file(path),
    ]


def test_checksums_are_one_metadata_entry_of_a_plain_file(tmp_path):
    path = tmp_path / "c.safetensors"
    t = _tensors()
    ft.save_file(t, path, metadata={"step": "3"}, checksum=True)
    with ft.safe_open(path, framework="pt") as f:
        meta = f.metadata()
    sums = json.loads(meta[KEY])
    assert meta["step"] == "3" and set(sums) == set(t)
    assert all(len(v) == 8 and int(v, 16) >= 0 for v in sums.values())
    theirs = st.load_file(path)  # still a plain safetensors file
    assert all(torch.equal(theirs[k], v) for k, v in t.items())
    back = ft.load_file(path, verify=True)
    assert all(torch.equal(back[k], v) for k, v in t.items())
    assert fastensor.verify_file(path)[0] == len(t)
    # Without checksum=True nothing is added, and a verified load says why it cannot.
    ft.save_file(t, path)
    with ft.safe_open(path, framework="pt") as f:
        assert f.metadata() is None
    with pytest.raises(ValueError, match="without checksums"):
        ft.load_file(path, verify=True)


@pytest.mark.parametrize("name", ["layer.0.w", "layer.3.w", "big", "ids"])
def test_a_flipped_byte_in_any_tensor_is_caught_and_named(tmp_path, name):
    path = tmp_path / "c.safetensors"
    ft.save_file(_tensors(), path, checksum=True)
    start, end = _range_of(path, name)
    _flip(path, (start + end) // 2)
    for load in _verified_loads(path):
        with pytest.raises(CorruptError) as err:
            load()
        assert f"`{name}`" in str(err.value) and "c.safetensors" in str(err.value)
    ft.load_file(path)  # (an unverified load does not look)


def test_swapped_tensors_are_caught(tmp_path):
    path = tmp_path / "s.safetensors"
    t = {"a": torch.ones(256), "b": torch.zeros(256)}
    ft.save_file(t, path, checksum=True)
    (a0, a1), (b0, b1) = _range_of(path, "a"), _range_of(path, "b")
    data = bytearray(path.read_bytes())
    data[a0:a1], data[b0:b1] = data[b0:b1], data[a0:a1]
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptError, match="checksum mismatch"):
        ft.load_file(path, verify=True)


def test_sharded_saves_keep_each_shards_checksums_and_a_truncated_shard_is_named(tmp_path):
    ckpt = tmp_path / "ckpt"
    t = _tensors()
    ft.save_sharded(t, ckpt, max_shard_size=1 << 20, checksum=True)
    shards = sorted(ckpt.glob("*.safetensors"))
    assert len(shards) >= 2
    for shard in shards:
        with ft.safe_open(shard, framework="pt") as f:
            assert set(json.loads(f.metadata()[KEY])) == set(f.keys())
    back = ft.load_sharded(ckpt, verify=True)
    assert all(torch.equal(back[k], v) for k, v in t.items())
    ft.load_into(_tensors(), ckpt, verify=True)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    big_shard = ckpt / index["weight_map"]["big"]
    start, end = _range_of(big_shard, "big")
    _flip(big_shard, start + 7)
    for load in (
        lambda: ft.load_sharded(ckpt, verify=True),
        lambda: ft.load_into(_tensors(), ckpt, verify=True),
    ):
        with pytest.raises(CorruptError) as err:
            load()
        assert "`big`" in str(err.value) and big_shard.name in str(err.value)
    os.truncate(big_shard, big_shard.stat().st_size - 64)
    with pytest.raises(CorruptError) as err:
        ft.load_into(_tensors(), ckpt, verify=True)
    assert "`big`" in str(err.value) and "truncated" in str(err.value)


def test_async_and_numpy_saves_and_slices_verify(tmp_path):
    path = tmp_path / "a.safetensors"
    t = _tensors()
    ft.save_file_async(t, path, checksum=True).wait()
    assert fastensor.verify_file(path)[0] == len(t)
    with ft.safe_open(path, framework="pt", verify=True) as f:
        assert torch.equal(f.get_slice("layer.1.w")[3:5, 1], t["layer.1.w"][3:5, 1])
    start, _ = _range_of(path, "layer.1.w")
    _flip(path, start + 3)
    with ft.safe_open(path, framework="pt", verify=True) as f:
        with pytest.raises(CorruptError, match="layer.1.w"):
            f.get_slice("layer.1.w")[0]
        assert f.get_tensor("ids").sum() == 45  # the other tensors still read
    arrays = {"x": np.arange(12.0).reshape(3, 4), "y": np.ones(5, np.int32)}
    npath = tmp_path / "n.safetensors"
    fn.save_file(arrays, npath, checksum=True)
    assert np.array_equal(fn.load_file(npath, verify=True)["x"], arrays["x"])
    _flip(npath, _range_of(npath, "y")[0])
    with pytest.raises(CorruptError, match="`y`"):
        fn.load_file(npath, verify=True)


def _cli() -> str | None:
    root = Path(__file__).resolve().parents[2]
    for build in ("release", "debug"):
        exe = root / "target" / build / "fastensor"
        if exe.exists():
            return str(exe)
    return shutil.which("fastensor")


def test_the_cli_verifies_a_file_and_a_directory(tmp_path):
    exe = _cli()
    if exe is None:
        pytest.skip("the fastensor command is not built")
    ckpt = tmp_path / "ckpt"
    ft.save_sharded(_tensors(), ckpt, max_shard_size=1 << 20, checksum=True)
    ok = subprocess.run([exe, "ckpt", "verify", ckpt], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert f"verified {len(_tensors())} tensors" in ok.stdout
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    with ft.safe_open(shard, framework="pt") as f:
        name = f.offset_keys()[0]
    _flip(shard, _range_of(shard, name)[0])
    bad = subprocess.run([exe, "ckpt", "verify", shard], capture_output=True, text=True)
    assert bad.returncode != 0 and f"`{name}`" in bad.stderr + bad.stdout


def test_dcp_data_files_carry_checksums(tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from fastensor.dcp import Writer

    state = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5)}
    dcp.save(state, storage_writer=Writer(tmp_path, checksum=True))
    (data,) = [p for p in tmp_path.iterdir() if p.suffix == ".safetensors"]
    assert fastensor.verify_file(data)[0] == 2
    _flip(data, _range_of(data, "0")[0])
    with pytest.raises(CorruptError, match="`0`"):
        fastensor.verify_file(data)


def _with_empty_tensors(at: int, run: int) -> dict[str, torch.Tensor]:
    """Three tensors with ``run`` empty ones put before the ``at``-th (an empty tensor's
    range starts where the next tensor's does)."""
    full = [
        ("f0", torch.arange(6, dtype=torch.float32).reshape(2, 3)),
        ("f1", torch.tensor([7, 8], dtype=torch.int64)),
        ("f2", torch.arange(5, dtype=torch.int16)),
    ]
    empty = [(f"e{k}", torch.empty((0, 3) if k else (0,), dtype=torch.float32)) for k in range(run)]
    return dict(full[:at] + empty + full[at:])


_EMPTY_LAYOUTS = [(at, run) for at in range(4) for run in (1, 2)]


def _save_with_checksums(tensors, path, writer: str) -> None:
    if writer == "fastensor":
        ft.save_file(tensors, path, checksum=True)
    elif writer == "fastensor-async":
        ft.save_file_async(tensors, path, checksum=True).wait()
    elif writer == "numpy":
        fn.save_file({k: v.numpy() for k, v in tensors.items()}, path, checksum=True)
    else:  # safetensors' own layout, with the checksums fastensor stores
        ft.save_file(tensors, str(path) + ".ours", checksum=True)
        with ft.safe_open(str(path) + ".ours", framework="pt") as f:
            sums = f.metadata()[KEY]
        st.save_file(tensors, path, metadata={KEY: sums})


def _same(got, want) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        g = torch.as_tensor(got[k])
        assert g.shape == v.shape and g.dtype == v.dtype and torch.equal(g, v), k


@pytest.mark.parametrize("writer", ["fastensor", "fastensor-async", "numpy", "safetensors"])
@pytest.mark.parametrize("at,run", _EMPTY_LAYOUTS)
def test_verified_loads_accept_empty_tensors_at_every_position(tmp_path, writer, at, run):
    want = _with_empty_tensors(at, run)
    path = tmp_path / "e.safetensors"
    _save_with_checksums(want, path, writer)
    _same(ft.load_file(path, verify=True), want)
    _same(ft.load_file(path, verify=True, engine=fastensor.Engine(mapped_loads=False)), want)
    _same(fn.load_file(path, verify=True), want)
    into = {k: torch.full_like(v, 3) for k, v in want.items()}
    ft.load_into(into, path, verify=True)
    _same(into, want)
    for module in (ft, fn):
        with module.safe_open(path, verify=True) as f:
            _same(f.get_tensors(), want)
            _same({k: f.get_tensor(k) for k in want}, want)
            _same({k: f.get_slice(k)[...] for k in want}, want)
    assert fastensor.verify_file(path)[0] == len(want)
    exe = _cli()
    if exe is not None:
        done = subprocess.run([exe, "ckpt", "verify", path], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("at,run", _EMPTY_LAYOUTS)
def test_verified_sharded_loads_accept_empty_tensors_at_every_position(tmp_path, at, run):
    want = _with_empty_tensors(at, run)
    ckpt = tmp_path / "ckpt"
    ft.save_sharded(want, ckpt, max_shard_size=24, checksum=True)
    _same(ft.load_sharded(ckpt, verify=True), want)
    into = {k: torch.full_like(v, 3) for k, v in want.items()}
    ft.load_into(into, ckpt, verify=True)
    _same(into, want)
    for shard in ckpt.glob("*.safetensors"):
        fastensor.verify_file(shard)


def test_a_verified_load_names_a_damaged_tensor_after_an_empty_one(tmp_path):
    path = tmp_path / "d.safetensors"
    ft.save_file(_with_empty_tensors(1, 2), path, checksum=True)
    _flip(path, _range_of(path, "f1")[0])
    for load in (
        lambda: ft.load_file(path, verify=True),
        lambda: fn.load_file(path, verify=True),
        lambda: ft.load_file(path, verify=True, engine=fastensor.Engine(mapped_loads=False)),
    ):
        with pytest.raises(CorruptError, match="`f1`"):
            load()


_RANDOM_DTYPES = [torch.float32, torch.int64, torch.uint8, torch.float16, torch.bool, torch.int16]


@hst.composite
def _random_state(draw) -> dict[str, torch.Tensor]:
    """1 to 6 tensors of random dtypes and shapes, at least one of them empty, in random
    order."""
    count = draw(hst.integers(1, 6))
    empty = draw(hst.integers(0, count - 1))
    out = {}
    for i in range(count):
        shape = draw(hst.lists(hst.integers(0 if i == empty else 1, 4), min_size=0, max_size=3))
        if i == empty and 0 not in shape:
            shape.append(0)
        dtype = draw(hst.sampled_from(_RANDOM_DTYPES))
        n = math.prod(shape)
        values = (torch.arange(n, dtype=torch.int64) * (7 + i) % 97).reshape(shape)
        out[f"t{i}"] = values.to(dtype) if dtype != torch.bool else values % 2 == 1
    return out


def _slice_outcome(slice_, index):
    """``slice_[index]``, or the class of the SafetensorError it raised."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch warns of truncated huge steps)
            return slice_[index]
    except fastensor.SafetensorError as exc:
        return type(exc)


@settings(max_examples=40, deadline=None)
@given(
    state=_random_state(), writer=hst.sampled_from(["fastensor", "safetensors"]), data=hst.data()
)
def test_verified_and_plain_reads_agree_on_random_files_with_empty_tensors(
    tmp_path_factory, state, writer, data
):
    path = tmp_path_factory.mktemp("p") / "p.safetensors"
    _save_with_checksums(state, path, writer)
    read = fastensor.Engine(mapped_loads=False)
    for verify in (False, True):
        _same(ft.load_file(path, verify=verify), state)
        _same(ft.load_file(path, verify=verify, engine=read), state)
        _same(fn.load_file(path, verify=verify), state)
    with ft.safe_open(path) as plain, ft.safe_open(path, verify=True) as checked:
        for name, t in state.items():
            for _ in range(3):
                index = data.draw(indices(t.shape))
                a = _slice_outcome(plain.get_slice(name), index)
                b = _slice_outcome(checked.get_slice(name), index)
                if isinstance(a, type) or isinstance(b, type):
                    assert a == b, (name, index, a, b)
                else:
                    assert a.shape == b.shape and torch.equal(a, b), (name, index)
                    assert torch.equal(a, _slice_outcome(t, index)), (name, index)
