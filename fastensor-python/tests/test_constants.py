"""The values Python and Rust share are Rust's: the rules Python applies are read from the
native module, so the two sides cannot disagree."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fastensor import _checksum, _common, _native


def test_the_checksum_key_and_alignment_are_the_checkpoint_codes():
    assert _checksum.CHECKSUMS_KEY == _native.CHECKSUMS_KEY == "fastensor.checksums"
    assert _common.IO_ALIGN == _native.DATA_ALIGN == 4096


@pytest.mark.parametrize(
    ("value", "flag"),
    [("1", True), ("on", True), ("YES", True), (" true ", True), ("0", False), ("Off", False)]
    + [("no", False), ("false", False), ("", None), ("2", None), ("enabled", None)],
)
def test_switches_are_read_by_one_rule(value, flag):
    assert _native.parse_flag(value) is flag


def test_a_tensor_of_its_own_is_placed_for_a_direct_read():
    mib = 1 << 20
    # Large and aligned to its elements: its address agrees with its file offset mod 4096.
    for offset, base in [(4096 * 3 + 100, 8), (0, 4000), (8192, 0), (12, 4095)]:
        pad = _common.pad_for(offset, base, 2 * mib, 4)
        assert 0 <= pad < 4096 and (base + pad) % 4096 == offset % 4096
    # Small, or an offset that is no multiple of the element size: no padding.
    assert _common.pad_for(4096 + 100, 8, mib - 1, 4) == 0
    assert _common.pad_for(4096 + 2, 8, 2 * mib, 4) == 0


def test_an_empty_profile_variable_means_no_profile(tmp_path):
    code = "from fastensor import _native; print(_native.default_profile_path())"
    for value, want in [("", "None"), (str(tmp_path / "p.toml"), str(tmp_path / "p.toml"))]:
        env = dict(os.environ, FASTENSOR_PROFILE=value, HOME=str(tmp_path))
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == want


def test_offload_defaults_are_the_rust_table():
    import inspect

    from fastensor.torch import offload

    table = _native.OFFLOAD_DEFAULTS
    params = inspect.signature(offload).parameters
    assert params["budget_bytes"].default == table["budget"] == 1 << 30
    assert params["min_bytes"].default == table["small_threshold"] == 1 << 20
    assert params["io_threads"].default == table["io_threads"]
    assert params["pack"].default is table["pack"] is True
    assert params["device_path"].default == table["device_path"] == "auto"


def test_the_device_path_is_parsed_once_by_the_native_rule():
    from fastensor.torch import offload

    for name in ("auto", "staged", "direct"):
        assert offload(device_path=name).device_path == _native.parse_device_path(name) == name
    with pytest.raises(ValueError, match="'auto', 'staged' or 'direct', not .gpu."):
        offload(device_path="gpu")
    with pytest.raises(ValueError, match="'auto', 'staged' or 'direct'"):
        _native.parse_device_path("Direct")
