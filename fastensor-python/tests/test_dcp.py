"""fastensor.dcp: torch.distributed.checkpoint's StorageWriter/StorageReader over fastensor.

Single-process round trips, then multi-process scenarios on gloo (CPU): save on 4 ranks
(plain and DTensor state, Adam state, a rank failing halfway, async save during training),
load resharded on 2 ranks and on 1.
"""

from __future__ import annotations

import os
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from _dist import run_world  # noqa: E402
from fastensor.dcp import METADATA_NAME, Reader, Writer  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        # DCP warns that no process group is initialized (single-process use).
        warnings.simplefilter("ignore", UserWarning)
        yield


def _state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {
        "f32": torch.randn(300, 129, generator=g),
        "bf16": torch.randn(64, 3, generator=g).to(torch.bfloat16),
        "i64": torch.arange(1000, dtype=torch.int64),
        "noncontig": torch.randn(40, 20, generator=g).t(),
        "big": torch.randn(1 << 19, generator=g),  # 2 MiB: read in place
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(2.5),
        "nested": {"u8": torch.randint(0, 255, (17,), dtype=torch.uint8, generator=g)},
        "obj": {"name": "x", "values": [1, 2.5, None]},
    }


def _zeros_like(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v)
        elif isinstance(v, dict):
            out[k] = _zeros_like(v)
        else:
            out[k] = None
    return out


def _assert_same(got, want, path=""):
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        a = got.contiguous().reshape(-1).view(torch.uint8)
        b = want.contiguous().reshape(-1).view(torch.uint8)
        assert torch.equal(a, b), path
    elif isinstance(want, dict):
        assert set(got) == set(want), path
        for k in want:
            _assert_same(got[k], want[k], f"{path}.{k}")
    else:
        assert got == want, path


def test_round_trip_bit_exact(tmp_path):
    sd = _state()
    dcp.save(sd, storage_writer=Writer(tmp_path))
    names = sorted(os.listdir(tmp_path))
    assert METADATA_NAME in names
    data = [n for n in names if n.endswith(".safetensors")]
    assert len(data) == 1 and data[0].startswith("__0_")
    back = _zeros_like(sd)
    ptr = back["big"].data_ptr()
    dcp.load(back, storage_reader=Reader(tmp_path))
    _assert_same(back, sd)
    assert back["big"].data_ptr() == ptr  # filled in place


def test_data_files_are_safetensors_of_raw_bytes(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    sd = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    dcp.save(sd, storage_writer=Writer(tmp_path))
    (data,) = [n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]
    loaded = st.load_file(str(tmp_path / data))
    (raw,) = loaded.values()
    assert raw.dtype == torch.uint8
    assert torch.equal(raw.view(torch.float32).reshape(3, 4), sd["w"])  # not pickled


def test_load_converts_dtype_and_fills_non_contiguous(tmp_path):
    sd = {"a": torch.randn(8, 6), "b": torch.randn(5, 7)}
    dcp.save(sd, storage_writer=Writer(tmp_path))
    back = {"a": torch.zeros(8, 6, dtype=torch.float64), "b": torch.zeros(7, 5).t()}
    dcp.load(back, storage_reader=Reader(tmp_path))
    assert torch.equal(back["a"], sd["a"].double())
    assert torch.equal(back["b"], sd["b"])


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    old = {"w": torch.ones(100, 100), "v": torch.full((10,), 3.0)}
    dcp.save(old, storage_writer=Writer(tmp_path))
    meta = (tmp_path / METADATA_NAME).read_bytes()

    class Broken(Writer):
        def write_data(self, plan, planner):
            raise OSError("disk on fire")

    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException):
        dcp.save(
            {"w": torch.zeros(100, 100), "v": torch.zeros(10)}, storage_writer=Broken(tmp_path)
        )
    assert (tmp_path / METADATA_NAME).read_bytes() == meta
    back = {"w": torch.zeros(100, 100), "v": torch.zeros(10)}
    dcp.load(back, storage_reader=Reader(tmp_path))
    _assert_same(back, old)


def test_a_new_save_removes_the_old_data_files(tmp_path):
    dcp.save({"w": torch.ones(4)}, storage_writer=Writer(tmp_path))
    first = {n for n in os.listdir(tmp_path) if n.endswith(".safetensors")}
    dcp.save({"w": torch.full((4,), 2.0)}, storage_writer=Writer(tmp_path))
    second = {n for n in os.listdir(tmp_path) if n.endswith(".safetensors")}
    assert len(second) == 1 and not first & second
    md = pickle.loads((tmp_path / METADATA_NAME).read_bytes())
    assert {i.relative_path for i in md.storage_data.values()} == second
    back = {"w": torch.zeros(4)}
    dcp.load(back, storage_reader=Reader(tmp_path))
    assert torch.equal(back["w"], torch.full((4,), 2.0))


def test_a_save_without_rank_coordination_writes_its_own_metadata_and_loads(tmp_path):
    dcp.save({"w": torch.ones(4)}, storage_writer=Writer(tmp_path))
    old_files = set(os.listdir(tmp_path))
    dcp.save(
        {"w": torch.full((4,), 2.0)},
        storage_writer=Writer(tmp_path),
        no_dist=True,
        use_collectives=False,
    )
    names = set(os.listdir(tmp_path))
    # Its own metadata; the coordinated save's metadata (which would be loaded instead)
    # and data file are gone.
    assert f"{METADATA_NAME}.rank0" in names
    assert METADATA_NAME not in names
    assert not (old_files & names)
    back = {"w": torch.zeros(4)}
    dcp.load(back, storage_reader=Reader(tmp_path), no_dist=True)
    assert torch.equal(back["w"], torch.full((4,), 2.0))
    # A coordinated save afterwards supersedes the rank's own metadata.
    dcp.save({"w": torch.full((4,), 3.0)}, storage_writer=Writer(tmp_path))
    assert not any(n.startswith(f"{METADATA_NAME}.rank") for n in os.listdir(tmp_path))
    dcp.load(back, storage_reader=Reader(tmp_path))
    assert torch.equal(back["w"], torch.full((4,), 3.0))


def test_reader_names_a_filesystemwriter_checkpoint(tmp_path):
    dcp.save({"w": torch.ones(4)}, storage_writer=dcp.FileSystemWriter(str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="FileSystemReader"):
        Reader(tmp_path).read_metadata()


def test_async_save_single_process(tmp_path):
    sd = {"w": torch.randn(256, 256)}
    want = sd["w"].clone()
    writer = Writer(tmp_path, cache_staged_state_dict=True)
    fut = dcp.async_save(sd, storage_writer=writer)
    sd["w"].add_(1)  # the snapshot was taken at the call
    fut.result(timeout=60)
    back = {"w": torch.zeros(256, 256)}
    dcp.load(back, storage_reader=Reader(tmp_path))
    assert torch.equal(back["w"], want)
    # The cached staging copy is reused by the next save.
    fut = dcp.async_save(sd, storage_writer=writer)
    fut.result(timeout=60)
    dcp.load(back, storage_reader=Reader(tmp_path))
    assert torch.equal(back["w"], want + 1)


@pytest.fixture(scope="module")
def saved_on_4(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp4")
    run_world("save", 4, d, timeout=180)
    return d


def test_save_on_4_ranks_failure_and_async(saved_on_4):
    assert (saved_on_4 / "ckpt" / METADATA_NAME).exists()
    assert (saved_on_4 / "async" / METADATA_NAME).exists()


def test_load_resharded_on_2_ranks(saved_on_4):
    out = run_world("load2", 2, saved_on_4, timeout=120)
    assert all("bit-exact" in o for o in out)


def test_load_resharded_on_1_rank(saved_on_4):
    out = run_world("load1", 1, saved_on_4, timeout=120)
    assert "bit-exact" in out[0]


def test_saves_without_rank_coordination_load_back_rank_by_rank(tmp_path):
    run_world("local", 2, tmp_path, timeout=120)
