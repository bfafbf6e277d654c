"""A load into new host memory is one job: the file mapped copy-on-write, its pages brought
in before ``load_file`` returns, each tensor with a storage of its own; what the mapping
shares with the file (a rename over it changes nothing; a cut in place waits until the
tensors' pages are moved into memory of the process: ``test_protected_loads.py``)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import fastensor
import pytest
import torch
from fastensor.torch import load_file, load_selected, save_file


@pytest.fixture
def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "big": torch.randn(1024, 1024, generator=g),
        "mid": torch.randn(3, 4097, generator=g),
        "half": torch.randn(5, 7, generator=g).to(torch.bfloat16),
        "ints": torch.arange(11, dtype=torch.int64),
        "flag": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }


def test_a_fresh_engine_maps_the_file_once_and_chooses_no_backend(tmp_path, tensors):
    path = tmp_path / "c.safetensors"
    save_file(tensors, path)
    engine = fastensor.Engine()
    out = load_file(path, engine=engine)
    assert list(out) == list(tensors)
    for k, v in tensors.items():
        assert torch.equal(out[k], v), k
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
    assert engine.new_loads() == (1, 0)
    d = engine.decisions()
    assert (d["choices"], d["explorations"], d["read_jobs"]) == (0, 0, 0)


def test_a_load_into_existing_tensors_is_one_job(tmp_path, tensors):
    path = tmp_path / "c.safetensors"
    save_file(tensors, path)
    engine = fastensor.Engine()
    into = {k: torch.zeros_like(v) for k, v in tensors.items()}
    fastensor.torch.load_into(into, path, engine=engine)
    assert all(torch.equal(into[k], v) for k, v in tensors.items())
    d = engine.decisions()
    assert d["read_jobs"] == 1 and d["choices"] <= 1, d


def test_a_pinned_engine_reads_into_memory_of_its_own(tmp_path, tensors):
    path = tmp_path / "c.safetensors"
    save_file(tensors, path)
    for engine in (fastensor.Engine(pin="posix"), fastensor.Engine(mapped_loads=False)):
        out = load_file(path, engine=engine)
        assert all(torch.equal(out[k], v) for k, v in tensors.items())
        assert engine.new_loads() == (0, 1)


def test_each_tensor_has_a_storage_of_its_own_and_writes_stay_in_the_process(tmp_path, tensors):
    path = tmp_path / "c.safetensors"
    save_file(tensors, path)
    before = path.read_bytes()
    out = load_file(path)
    for k, v in out.items():
        assert v.untyped_storage().nbytes() == v.numel() * v.element_size(), k
    buf = io.BytesIO()
    torch.save(out["mid"], buf)
    assert len(buf.getvalue()) < out["big"].numel()  # one tensor's bytes, not the file's
    out["big"].fill_(7.0)
    out["ints"] += 1
    assert path.read_bytes() == before
    again = load_file(path)
    assert torch.equal(again["big"], tensors["big"])
    assert torch.equal(again["ints"], tensors["ints"])


def test_tensors_outlive_the_others_of_their_load_and_the_file(tmp_path, tensors):
    path = tmp_path / "c.safetensors"
    save_file(tensors, path)
    out = load_file(path)
    keep = out["mid"]
    del out
    os.unlink(path)
    assert torch.equal(keep, tensors["mid"])


def test_a_file_replaced_by_rename_leaves_loaded_tensors_as_they_were(tmp_path, tensors):
    path = tmp_path / "c.safetensors"
    save_file(tensors, path)
    out = load_file(path)
    save_file({k: v + 1 if v.is_floating_point() else v for k, v in tensors.items()}, path)
    for k, v in tensors.items():
        assert torch.equal(out[k], v), k


def test_load_selected_maps_only_what_it_returns_in_the_order_asked(tmp_path, tensors):
    path = tmp_path / "c.safetensors"
    save_file(tensors, path)
    engine = fastensor.Engine()
    out = load_selected(path, ["ints", "big"], engine=engine)
    assert list(out) == ["ints", "big"]
    assert torch.equal(out["big"], tensors["big"])
    assert engine.new_loads() == (1, 0)
    with pytest.raises(FileNotFoundError, match="nope"):
        load_selected(path, ["big", "nope"], engine=engine)


CUT_AFTER_LOAD = """
import os, sys
import fastensor.torch as ft
out = ft.load_file(sys.argv[1])
with open(sys.argv[1], "r+b") as f:
    f.truncate(4096)
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
print(float(out["big"][-1, -1]))
"""


def test_a_file_cut_in_place_under_live_tensors_leaves_them_as_they_were(tmp_path, tensors):
    path = tmp_path / "c.safetensors"
    save_file(tensors, path)
    done = subprocess.run(
        [sys.executable, "-c", CUT_AFTER_LOAD, str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert float(done.stdout) == float(tensors["big"][-1, -1])


def test_a_file_cut_before_the_load_is_a_clear_error(tmp_path, tensors):
    path = tmp_path / "c.safetensors"
    save_file(tensors, path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    with pytest.raises(ValueError, match="c.safetensors"):
        load_file(path)


def test_numpy_loads_are_mapped_writable_arrays(tmp_path):
    import numpy as np
    from fastensor.numpy import load_file as np_load_file
    from fastensor.numpy import load_selected as np_load_selected
    from fastensor.numpy import save_file as np_save_file

    arrays = {"a": np.arange(300_000, dtype=np.float32).reshape(600, 500), "b": np.ones(3)}
    path = tmp_path / "n.safetensors"
    np_save_file(arrays, path)
    engine = fastensor.Engine()
    out = np_load_file(path, engine=engine)
    assert engine.new_loads() == (1, 0)
    assert all(np.array_equal(out[k], v) and out[k].dtype == v.dtype for k, v in arrays.items())
    assert out["a"].flags.writeable
    out["a"][0, 0] = -1
    assert np_load_file(path)["a"][0, 0] == 0
    assert list(np_load_selected(path, ["b", "a"])) == ["b", "a"]
