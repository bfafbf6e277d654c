"""safe_open as safetensors users use it: slices read in part, every tensor at once, the file
released when the context exits, and the errors code written for safetensors catches."""

import os

import fastensor
import numpy as np
import pytest
import torch
from fastensor import SafetensorError
from fastensor.numpy import save_file as save_np
from fastensor.torch import load_file, safe_open, save_file
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.fixture
def matrix_file(tmp_path):
    a = torch.arange(50, dtype=torch.float32).reshape(10, 5)
    path = tmp_path / "m.safetensors"
    save_file({"a": a, "b": torch.ones(3, dtype=torch.int16)}, path)
    return path, a


def test_slices_give_what_torch_indexing_gives(matrix_file):
    path, a = matrix_file
    with safe_open(path, framework="pt") as f:
        s = f.get_slice("a")
        assert s.get_shape() == [10, 5] and s.get_dtype() == "F32" and len(s) == 10
        for index in [
            slice(None),
            (),
            slice(2, 4),
            (slice(None), slice(0, 2)),
            (0, slice(None, 2)),
            (slice(2, None), -1),
            (slice(1, 9, 3), 4),
            (slice(None, None, 2), slice(1, 5, 2)),
            (Ellipsis, 3),
            (-10,),
        ]:
            got = s[index]
            assert torch.equal(got, a[index]), index
            assert got.is_contiguous()
        assert s[[]].shape == (0, 5)  # an empty list: no rows, as in safetensors


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=4),
    data=st.data(),
)
def test_random_slices_match_torch(tmp_path_factory, shape, data):
    t = torch.arange(int(np.prod(shape)), dtype=torch.int16).reshape(shape)
    path = tmp_path_factory.mktemp("s") / "r.safetensors"
    save_file({"t": t}, path)
    index = []
    for n in shape[: data.draw(st.integers(0, len(shape)))]:
        if n and data.draw(st.booleans()):
            index.append(data.draw(st.integers(-n, n - 1)))
        else:
            start = data.draw(st.integers(0, n))
            stop = data.draw(st.integers(start, n))
            index.append(slice(start, stop, data.draw(st.integers(1, 3))))
    with safe_open(path, framework="pt") as f:
        assert torch.equal(f.get_slice("t")[tuple(index)], t[tuple(index)])


def test_a_slice_reads_only_the_bytes_it_needs(tmp_path):
    rows, cols = 4096, 4096  # 64 MiB
    t = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
    path = tmp_path / "big.safetensors"
    save_file({"t": t}, path)
    engine = fastensor.Engine(backends=["posix"])  # pread: counted in /proc/self/io

    def read_bytes() -> int:
        with open("/proc/self/io") as io:
            return int(next(line for line in io if line.startswith("rchar")).split()[1])

    with safe_open(path, framework="pt", engine=engine) as f:
        s = f.get_slice("t")
        before = read_bytes()
        part = s[100:102]
        rows_read = read_bytes() - before
        column = s[:8, 7]
    assert torch.equal(part, t[100:102]) and torch.equal(column, t[:8, 7])
    assert rows_read < 1 << 20, rows_read  # two rows (32 KiB) and alignment, not 64 MiB


def test_numpy_slices_and_their_errors(tmp_path):
    a = np.random.default_rng(0).random((10, 5))
    path = tmp_path / "n.safetensors"
    save_np({"a": a}, path)
    with fastensor.safe_open(path, framework="np") as f:
        s = f.get_slice("a")
        np.testing.assert_array_equal(s[2:, -5], a[2:, -5])
        np.testing.assert_array_equal(s[:, 1:3], a[:, 1:3])
        cases = [
            ((slice(2, None), -6), "Invalid index -6 for dimension 1 of size 5"),
            (
                (slice(2, None), 20),
                "Error during slicing [2:, 20] with shape [10, 5]: index 20 out of bounds for"
                " tensor dimension #1 of size 5",
            ),
        ]
        for index, message in cases:
            with pytest.raises(SafetensorError) as err:
                s[index]
            assert str(err.value) == message
            assert isinstance(err.value, ValueError)
        # Bounds are clamped and None adds a dimension, as numpy does.
        np.testing.assert_array_equal(s[:20], a[:20])
        np.testing.assert_array_equal(s[-20:3, None, 4:9], a[-20:3, None, 4:9])
        with pytest.raises(SafetensorError, match="Non empty lists"):
            s[[0, 1]]
        with pytest.raises(SafetensorError, match="negative steps"):
            s[::-1]
        with pytest.raises(SafetensorError, match="a step of 0"):
            s[::0]


def test_get_tensors_reads_every_tensor(matrix_file):
    path, _ = matrix_file
    with safe_open(path, framework="pt") as f:
        every = f.get_tensors()
        assert f.keys() == ["a", "b"] and f.offset_keys() == ["a", "b"]
    whole = load_file(path)
    assert every.keys() == whole.keys()
    assert all(torch.equal(every[k], whole[k]) for k in whole)


def _open_fds_to(path) -> int:
    target = os.path.realpath(path)
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}") == target)


def test_leaving_the_context_releases_the_file(matrix_file):
    path, a = matrix_file
    with safe_open(path, framework="pt") as f:
        assert _open_fds_to(path) >= 1
        s = f.get_slice("a")
    assert _open_fds_to(path) == 0
    for call in (f.keys, f.metadata, lambda: f.get_tensor("a"), lambda: s[0]):
        with pytest.raises(SafetensorError, match="closed"):
            call()
    # The file can be replaced or removed at once.
    with open(path, "w") as g:
        g.write("something")
    os.remove(path)


def test_errors_safetensors_users_catch(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        safe_open(tmp_path / "missing.safetensors", framework="pt")
    assert str(err.value) == f"No such file or directory: {tmp_path / 'missing.safetensors'}"
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    for load in (load_file, lambda p: safe_open(p, framework="pt")):
        with pytest.raises(SafetensorError) as err:
            load(bad)
        assert isinstance(err.value, fastensor.errors.CorruptError)
        assert isinstance(err.value, ValueError)
    assert SafetensorError.__module__ == "fastensor.errors"


def test_safe_open_on_a_device(matrix_file):
    path, a = matrix_file
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    with fastensor.safe_open(path, framework="pt", device=device) as f:
        assert f.get_tensor("a").device == torch.device(device)
        part = f.get_slice("a")[:1]
        assert part.device == torch.device(device) and torch.equal(part.cpu(), a[:1])
    with pytest.raises(ValueError):
        fastensor.safe_open(path, framework="np", device="cuda:0")


def _host_backends() -> list[str]:
    return [b.name for b in fastensor.backends() if b.available and b.name in _HOST_BACKENDS]


_HOST_BACKENDS = ("posix", "posix-direct", "mmap", "uring")


def _change_path(path, how: str, tmp_path) -> None:
    """What may happen to the path of an open file: another file renamed over it, the
    file removed, renamed away, or a directory put in its place."""
    if how == "renamed over":
        other = tmp_path / "other.safetensors"
        save_file({"a": -torch.ones(10, 5), "b": torch.zeros(3, dtype=torch.int16)}, other)
        os.replace(other, path)
    elif how == "removed":
        os.unlink(path)
    elif how == "renamed away":
        os.replace(path, tmp_path / "elsewhere.safetensors")
    else:
        os.unlink(path)
        os.mkdir(path)


@pytest.mark.parametrize("how", ["renamed over", "removed", "renamed away", "a directory"])
@pytest.mark.parametrize("verify", [False, True])
def test_one_handle_gives_one_files_data_through_every_method(tmp_path, how, verify):
    a = torch.arange(50, dtype=torch.float32).reshape(10, 5)
    b = torch.arange(3, dtype=torch.int16)
    for pin in [None, *_host_backends()]:
        path = tmp_path / "m.safetensors"
        save_file({"a": a, "b": b}, path, metadata={"v": "1"}, checksum=True)
        engine = fastensor.Engine(backends=list(_host_backends()), pin=pin)
        with (
            safe_open(path, framework="pt", engine=engine, verify=verify) as f,
            fastensor.safe_open(path, framework="np", engine=engine, verify=verify) as n,
        ):
            _change_path(path, how, tmp_path)
            what = f"{how}, pin {pin}, verify {verify}"
            assert f.keys() == ["a", "b"] and f.metadata()["v"] == "1", what
            assert torch.equal(f.get_tensor("a"), a), what
            got = f.get_tensors()
            assert torch.equal(got["a"], a) and torch.equal(got["b"], b), what
            s = f.get_slice("a")
            assert torch.equal(s[2:7:2, 1:], a[2:7:2, 1:]), what
            assert torch.equal(s[[1, 8]], a[[1, 8]]), what
            assert torch.equal(f.get_slice("b")[None, -1], b[None, -1]), what
            np.testing.assert_array_equal(n.get_tensor("a"), a.numpy(), err_msg=what)
            np.testing.assert_array_equal(n.get_slice("a")[3, ::2], a.numpy()[3, ::2], what)
        if path.is_dir():
            path.rmdir()
        elif path.exists():
            path.unlink()
