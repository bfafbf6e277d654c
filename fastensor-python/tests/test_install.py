"""The package under test is the wheel users install: abi3 (one wheel for CPython 3.11 and
later), manylinux_2_28 or older, its native module needing no newer glibc symbol, installed
and run with no Rust toolchain on PATH. ``scripts/test`` builds it (``scripts/wheel``) and
sets ``FASTENSOR_REQUIRE_WHEEL``; elsewhere (a package built from source) this skips."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(
    not os.environ.get("FASTENSOR_REQUIRE_WHEEL"),
    reason="not the wheel of scripts/test (FASTENSOR_REQUIRE_WHEEL unset)",
)


def _tags() -> list[str]:
    wheel = importlib.metadata.distribution("fastensor").read_text("WHEEL") or ""
    return [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]


def test_the_installed_wheel_is_abi3_and_manylinux_2_28_or_older():
    tags = _tags()
    assert tags, "no wheel tags: fastensor was not installed from a wheel"
    for tag in tags:
        python, abi, platform = tag.split("-")
        assert (python, abi) == ("cp311", "abi3"), tag
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", platform)
        assert m, tag
        assert (int(m[1]), int(m[2])) <= (2, 28), tag


def test_the_native_module_needs_no_glibc_newer_than_its_tag():
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump to read the module's symbol versions")
    from fastensor import _native

    out = subprocess.run(
        [objdump, "-T", _native.__file__], check=True, capture_output=True, text=True
    ).stdout
    versions = {
        tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", out)
    }
    assert versions, "the module names no glibc symbol version"
    assert max(versions) <= (2, 28), sorted(versions)[-3:]


def test_no_rust_toolchain_is_on_path():
    assert shutil.which("cargo") is None
    assert shutil.which("rustc") is None
