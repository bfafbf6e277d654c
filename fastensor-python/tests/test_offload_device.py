"""The offload store's GPU path from Python: CUDA memory handed over by DLPack (with the
stream handshake) and copied back into CUDA memory on a stream, on the staged and the direct
path. Without a GPU it runs against the CUDA stand-in (``scripts/test`` runs this file under
``fastensor-testkit/cuda-stand-in/run``), with fastensor's own ``DeviceArray`` as the CUDA
tensor; elsewhere it skips, saying why. ``_offload.py``'s CUDA path itself (torch tensors)
runs on a real GPU in ``scripts/gpu-check.sh``."""

from __future__ import annotations

import ast
import inspect
import random

import pytest
from fastensor import _native

MIB = 1 << 20


def _cuda_or_skip() -> None:
    try:
        _native.DeviceArray.zeros(1, 0)
    except Exception as e:  # noqa: BLE001 (any reason CUDA cannot run here)
        pytest.skip(f"no CUDA (not even the stand-in) in this process: {e}")


def _store(tmp_path, path: str, budget: int = 2 * MIB, device_write_behind: int | None = 0):
    """A store that copies out every CUDA tensor at its put, unless ``device_write_behind``
    says how many bytes of the last ones to keep on their device (``None``: the default)."""
    from fastensor._engine import engine_or_default

    return _native.OffloadStore(
        engine_or_default(None),
        str(tmp_path),
        budget,
        device_path=path,
        device_write_behind=device_write_behind,
    )


@pytest.mark.parametrize("path", ["staged", "direct"])
def test_cuda_memory_round_trips_bit_exact_at_odd_sizes(tmp_path, path):
    _cuda_or_skip()
    store = _store(tmp_path, path)
    rng = random.Random(3)
    sizes = [1, 4095, 4097, 65_537, MIB + 3, 3 * MIB, 7]
    data = [rng.randbytes(n) for n in sizes]
    arrays = [_native.DeviceArray.from_bytes(d, 0) for d in data]
    handles = [store.put_device(a, f"t{i}") for i, a in enumerate(arrays)]
    del arrays  # the store holds the memory until copied out or written
    store.expect_backward()
    for i in reversed(range(len(sizes))):
        out = _native.DeviceArray.zeros(sizes[i], 0)
        store.get_into(handles[i], out)
        assert out.to_bytes() == data[i], f"tensor {i}"
    store.flush()  # the writes still under way (a get may take a tensor being written)
    stats = store.stats()
    assert stats["device_puts"] == stats["device_gets"] == len(sizes)
    assert stats["bytes_written"] >= sum(sizes)
    store.close()


@pytest.mark.parametrize("path", ["staged", "direct"])
def test_the_last_cuda_tensors_stay_on_their_device_and_the_older_ones_are_written(tmp_path, path):
    _cuda_or_skip()
    store = _store(tmp_path, path, budget=4 * MIB, device_write_behind=None)
    rng = random.Random(5)
    data = [rng.randbytes(MIB + i) for i in range(6)]
    handles = [
        store.put_device(_native.DeviceArray.from_bytes(d, 0), f"t{i}") for i, d in enumerate(data)
    ]
    stats = store.stats()
    kept = stats["device_unwritten_bytes"]
    assert 0 < kept <= 4 * MIB, "the default keeps up to the budget on the device"
    assert stats["peak_device_unwritten_bytes"] == kept
    store.expect_backward()
    for i in reversed(range(len(data))):
        out = _native.DeviceArray.zeros(len(data[i]), 0)
        store.get_into(handles[i], out)
        assert out.to_bytes() == data[i], f"tensor {i}"
    store.flush()
    stats = store.stats()
    assert stats["device_unwritten_bytes"] == 0
    assert stats["bytes_never_written"] == kept, "the kept ones were never written"
    assert stats["bytes_written"] == sum(map(len, data)) - kept
    store.close()


def test_a_destination_of_the_wrong_length_or_kind_is_refused(tmp_path):
    _cuda_or_skip()
    store = _store(tmp_path, "staged")
    h = store.put_device(_native.DeviceArray.from_bytes(b"x" * 5000, 0), "y")
    with pytest.raises(ValueError, match="5000"):
        store.get_into(h, _native.DeviceArray.zeros(4999, 0))
    with pytest.raises(ValueError, match="CUDA"):
        store.get_into(h, bytearray(5000))
    with pytest.raises(ValueError, match="CUDA"):
        store.put_device(bytearray(10), "host")
    out = _native.DeviceArray.zeros(5000, 0)
    store.get_into(h, out)
    assert out.to_bytes() == b"x" * 5000
    store.close()


def test_offload_has_no_synchronous_device_copy():
    """pack and unpack never wait for the device: no ``.to()``, ``.cuda()``, ``.cpu()``,
    ``.copy_()``, ``synchronize()`` or ``pin_memory`` in the offload module."""
    from fastensor import _offload, _offload_block

    tree = ast.parse(inspect.getsource(_offload) + inspect.getsource(_offload_block))
    banned = {"to", "cuda", "cpu", "copy_", "synchronize", "pin_memory", "item", "tolist"}
    calls = [
        n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in banned
    ]
    assert calls == [], calls
    keywords = [k.arg for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords]
    assert "pin_memory" not in keywords
