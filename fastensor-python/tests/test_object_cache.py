"""The local cache of remote checkpoints (``Engine(cache_dir=...)``, ``FASTENSOR_CACHE_DIR``),
on every store (``_s3.py``): a second load is a local load (no body bytes from the server,
the local copy mapped), a replaced object is fetched again and never served stale, processes
loading the same object together download it once, a killed download leaves no entry a
later load could take for complete, and the cache keeps to its size. What needs the server
to count bytes or slow down (s3, gs) is skipped on Azurite, which cannot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import fastensor
import fastensor.torch as ft
import pytest
import torch
from _s3 import server_binary

pytestmark = pytest.mark.skipif(
    server_binary() is None, reason="no S3 server (FASTENSOR_S3_SERVER unset)"
)

MIB = 1 << 20


def counts(server) -> bool:
    """Whether the server counts the bytes it sends (and can be slowed down)."""
    return server.faults


def needs_counts(server) -> None:
    if not counts(server):
        pytest.skip(f"{server.scheme}://'s emulator (Azurite) neither counts bytes nor delays")


def tensors(seed: int, rows: int = 1000) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(rows, 1000, generator=g),
        "ids": torch.arange(seed, seed + 91, dtype=torch.int64),
    }


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


def entries(cache) -> list[str]:
    return sorted(os.listdir(cache / "objects"))


def test_a_second_load_is_a_local_mapped_load_with_no_bytes_from_the_server(server, tmp_path):
    t = tensors(1)
    ft.save_file(t, server.url("cache/m.safetensors"))
    size = len(server.read("cache/m.safetensors"))
    cache = tmp_path / "cache"
    engine = fastensor.Engine(cache_dir=cache)
    server.clear()
    assert_equal(ft.load_file(server.url("cache/m.safetensors"), engine=engine), t)
    if counts(server):
        assert size <= server.sent_bytes() < size + MIB, "fetched once, whole"
    (name,) = entries(cache)
    assert name.endswith("-m.safetensors")
    assert (cache / "objects" / name).stat().st_size == size

    server.clear()
    mapped_before = engine.new_loads()[0]
    assert_equal(ft.load_file(server.url("cache/m.safetensors"), engine=engine), t)
    if counts(server):
        assert server.sent_bytes() == 0, "only a HEAD: no body crossed"
    assert engine.new_loads()[0] == mapped_before + 1, "the local copy is mapped"
    # Every way of reading takes the cached copy.
    assert_equal(
        ft.load_selected(server.url("cache/m.safetensors"), ["ids"], engine=engine),
        {"ids": t["ids"]},
    )
    with fastensor.safe_open(server.url("cache/m.safetensors"), "pt", engine=engine) as f:
        assert torch.equal(f.get_tensor("w"), t["w"])
    if counts(server):
        assert server.sent_bytes() == 0


def test_a_replaced_object_is_fetched_again_never_served_stale(server, tmp_path):
    cache = tmp_path / "cache"
    engine = fastensor.Engine(cache_dir=cache)
    ft.save_file(tensors(2), server.url("cache/r.safetensors"))
    assert_equal(ft.load_file(server.url("cache/r.safetensors"), engine=engine), tensors(2))
    # The same size, other bytes: only the version (ETag) tells them apart.
    ft.save_file(tensors(3), server.url("cache/r.safetensors"))
    server.clear()
    assert_equal(ft.load_file(server.url("cache/r.safetensors"), engine=engine), tensors(3))
    if counts(server):
        assert server.sent_bytes() > 0
    assert len(entries(cache)) == 2, "one entry per version"


def test_without_a_cache_every_load_reads_the_server(server, tmp_path):
    needs_counts(server)
    ft.save_file(tensors(4), server.url("cache/n.safetensors"))
    engine = fastensor.Engine()
    server.clear()
    for _ in range(2):
        assert_equal(ft.load_file(server.url("cache/n.safetensors"), engine=engine), tensors(4))
    size = len(server.read("cache/n.safetensors"))
    assert server.sent_bytes() >= 2 * size


_LOADER = """
import sys, fastensor.torch as ft
t = ft.load_file(sys.argv[1])
print(float(t["w"].sum()), flush=True)
"""


def _loader(cache, url: str) -> subprocess.Popen:
    env = dict(os.environ, FASTENSOR_CACHE_DIR=str(cache))
    return subprocess.Popen(
        [sys.executable, "-c", _LOADER, url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_processes_loading_the_same_object_together_download_it_once(server, tmp_path):
    needs_counts(server)
    t = tensors(5, rows=4000)  # 16 MB
    ft.save_file(t, server.url("cache/shared.safetensors"))
    size = len(server.read("cache/shared.safetensors"))
    cache = tmp_path / "cache"
    server.clear()
    # Slow GETs: both processes are in the fetch at once.
    server.fault("delay", "GET", times=4, delay_ms=300)
    procs = [_loader(cache, server.url("cache/shared.safetensors")) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert float(out) == pytest.approx(float(t["w"].sum()))
    assert size <= server.sent_bytes() < 1.5 * size, "downloaded once for three processes"
    assert len(entries(cache)) == 1


def test_a_killed_download_leaves_no_entry_a_later_load_takes(server, tmp_path):
    needs_counts(server)
    t = tensors(6, rows=4000)
    ft.save_file(t, server.url("cache/killed.safetensors"))
    cache = tmp_path / "cache"
    server.clear()
    server.fault("delay", "GET", times=100, delay_ms=2000)
    p = _loader(cache, server.url("cache/killed.safetensors"))
    deadline = time.monotonic() + 30
    partial = cache / "partial"
    while not (partial.exists() and os.listdir(partial)):
        assert time.monotonic() < deadline, "the download never started"
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    server.clear()
    assert entries(cache) == [], "nothing published by a killed download"
    engine = fastensor.Engine(cache_dir=cache)
    assert_equal(ft.load_file(server.url("cache/killed.safetensors"), engine=engine), t)
    assert len(entries(cache)) == 1
    assert os.listdir(cache / "partial") == [], "the dead process's partial file is gone"


def test_the_cache_keeps_to_its_size_least_recently_used_first(server, tmp_path):
    for i in range(3):
        ft.save_file(tensors(10 + i), server.url(f"cache/lru{i}.safetensors"))
    size = len(server.read("cache/lru0.safetensors"))
    cache = tmp_path / "cache"
    engine = fastensor.Engine(cache_dir=cache, cache_max_bytes=2 * size + size // 2)
    for i in (0, 1):
        ft.load_file(server.url(f"cache/lru{i}.safetensors"), engine=engine)
        time.sleep(0.05)  # distinct use times
    ft.load_file(server.url("cache/lru0.safetensors"), engine=engine)  # used again: lru1 is older
    time.sleep(0.05)
    ft.load_file(server.url("cache/lru2.safetensors"), engine=engine)
    names = entries(cache)
    assert len(names) == 2
    assert any(n.endswith("lru0.safetensors") for n in names)
    assert any(n.endswith("lru2.safetensors") for n in names)
    # An object larger than the whole cache is loaded, not cached.
    small = fastensor.Engine(cache_dir=tmp_path / "small", cache_max_bytes=size // 2)
    assert_equal(ft.load_file(server.url("cache/lru2.safetensors"), engine=small), tensors(12))
    assert entries(tmp_path / "small") == []


def test_cache_settings_are_checked():
    with pytest.raises(ValueError, match="cache_dir"):
        fastensor.Engine(cache_max_bytes=1 << 30)
