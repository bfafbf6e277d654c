"""Memory: loaded tensors are freed with them (no reference kept by fastensor)."""

import gc
import os

import torch
from fastensor.torch import load_file, save_file, save_file_async


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_load_and_free_loop_keeps_rss_flat(tmp_path, engine):
    path = tmp_path / "m.safetensors"
    tensors = {f"w{i}": torch.randn(1 << 18) for i in range(16)}  # 16 MiB in all
    save_file(tensors, path, engine=engine)
    del tensors
    for _ in range(5):  # warm up the allocator
        load_file(path, engine=engine)
    gc.collect()
    before = rss_bytes()
    for _ in range(40):  # 640 MiB loaded in all
        state = load_file(path, engine=engine)
        del state
    gc.collect()
    grown = rss_bytes() - before
    assert grown < 48 << 20, f"RSS grew by {grown >> 20} MiB over 40 loads of 16 MiB"


def test_loaded_tensors_hold_no_hidden_references(tmp_path, engine):
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(1 << 20)}, path, engine=engine)
    t = load_file(path, engine=engine)["w"]
    # The tensor is the only owner of its storage (a view of one torch allocation).
    import sys

    assert sys.getrefcount(t) == 2


def test_async_staging_is_bounded_to_one_buffer(tmp_path, engine):
    t = {"w": torch.ones(1 << 20)}
    handles = [save_file_async(t, tmp_path / f"{i}.safetensors", engine=engine) for i in range(4)]
    for h in handles:
        h.wait()
    assert engine.staging_bytes < 2 * (4 << 20) + (1 << 20)
