"""Bad files and bad arguments raise the exception a user would catch, naming the file."""

import os
import subprocess
import sys

import fastensor
import pytest
import torch
from conftest import leftovers
from fastensor import errors
from fastensor.torch import load_file, load_into, save_file


def good_file(tmp_path):
    path = tmp_path / "good.safetensors"
    save_file({"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3)}, path)
    return path


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_file(tmp_path / "absent.safetensors")
    assert isinstance(err.value, fastensor.FastensorError)
    assert "absent.safetensors" in str(err.value)
    assert err.value.errno == 2 and err.value.filename.endswith("absent.safetensors")


def test_truncated_file_is_corrupt(tmp_path):
    path = good_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError) as err:
        load_file(path)
    assert isinstance(err.value, errors.CorruptError)
    assert "good.safetensors" in str(err.value)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x01\x02",
        (5).to_bytes(8, "little") + b"{bad}",
        (2).to_bytes(8, "little") + b"[]",
        (40).to_bytes(8, "little") + b'{"a":{"dtype":"F32","shape":[2]}}'.ljust(40),
        (64).to_bytes(8, "little")
        + b'{"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}'.ljust(64)
        + b"\0" * 4,
        (1 << 40).to_bytes(8, "little"),
    ],
)
def test_garbage_is_corrupt_and_named(tmp_path, content):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        load_file(path)
    assert isinstance(err.value, fastensor.FastensorError)
    assert "bad.safetensors" in str(err.value)


def test_corrupt_tensor_is_named(tmp_path):
    path = tmp_path / "bad.safetensors"
    header = b'{"w0":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    with pytest.raises(errors.CorruptError, match="w0"):
        load_file(path)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(fastensor.FastensorError) as err:
        load_file(tmp_path)
    assert isinstance(err.value, (ValueError, OSError))


def test_wrong_argument_types(tmp_path):
    with pytest.raises(TypeError):
        save_file([torch.ones(2)], tmp_path / "x.safetensors")
    with pytest.raises(TypeError):
        save_file({1: torch.ones(2)}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError):
        save_file({"a": torch.ones(2)}, tmp_path / "x.safetensors", metadata={"k": 1})
    with pytest.raises(ValueError):
        save_file({"a": torch.ones(2).to_sparse()}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError):
        load_into(object(), good_file(tmp_path))
    with pytest.raises(ValueError):
        save_file({"__metadata__": torch.ones(1)}, tmp_path / "x.safetensors")
    assert leftovers(tmp_path) == []


def test_unwritable_target_is_permission_or_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        save_file({"a": torch.ones(2)}, tmp_path / "missing-dir" / "x.safetensors")


def test_import_needs_neither_torch_nor_numpy():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
        "import fastensor\n"
        "assert any(b.name == 'posix' for b in fastensor.backends())\n"
        "print('ok')"
    )
    env = dict(os.environ, FASTENSOR_PROFILE="")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
