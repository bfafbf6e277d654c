#!/usr/bin/env python3
"""Runs the safetensors project's own Python tests against fastensor through a module shim.

The tests are not part of this repository: they are read from a checkout of
https://github.com/huggingface/safetensors (``--safetensors DIR``; or cloned into a
temporary folder when the machine has network access). The files

    bindings/python/tests/test_pt_comparison.py
    bindings/python/tests/test_pt_model.py
    bindings/python/tests/test_simple.py

are copied into a temporary folder and run twice with pytest: once as they are (against the
installed ``safetensors`` package: the baseline), once with a ``conftest.py`` that maps
``safetensors`` -> ``fastensor``, ``safetensors.torch`` -> ``fastensor.torch`` and
``safetensors.numpy`` -> ``fastensor.numpy`` in ``sys.modules``. It prints how many of the
tests that pass on safetensors pass on fastensor, and each one that does not with the first
line of its failure. Exit status 0 when at least ``--need`` of them pass.

    .venv/bin/python scripts/safetensors_compat.py --safetensors ~/src/safetensors

(run with the interpreter of a venv where fastensor, safetensors, torch, numpy and pytest
are installed). The result of the last run is recorded in docs/dropin.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

TESTS = ("test_pt_comparison.py", "test_pt_model.py", "test_simple.py")
REPO_URL = "https://github.com/huggingface/safetensors"

SHIM = '''"""Maps the safetensors modules onto fastensor's before any test imports them."""

import sys

import fastensor
import fastensor.numpy
import fastensor.torch

sys.modules["safetensors"] = fastensor
sys.modules["safetensors.torch"] = fastensor.torch
sys.modules["safetensors.numpy"] = fastensor.numpy
'''


def _tests_dir(source: Path | None, scratch: Path) -> Path:
    """The ``bindings/python/tests`` folder of a safetensors checkout (cloned if needed)."""
    if source is None:
        source = scratch / "safetensors-src"
        subprocess.run(
            ["git", "clone", "--depth", "1", "--quiet", REPO_URL, str(source)],
            check=True,
        )
    tests = source / "bindings" / "python" / "tests"
    if not tests.is_dir():
        sys.exit(
            f"{source}: no bindings/python/tests folder (not a safetensors checkout?)"
        )
    return tests


def _stage(tests: Path, into: Path, shim: bool) -> Path:
    """A folder laid out as safetensors' ``bindings/python`` (the tests write to
    ``./tests/data``), with the shim's conftest when ``shim``."""
    root = into / ("fastensor" if shim else "safetensors")
    (root / "tests" / "data").mkdir(parents=True)
    for name in TESTS:
        shutil.copy(tests / name, root / "tests" / name)
    (root / "tests" / "data" / "__init__.py").touch()
    if shim:
        (root / "tests" / "conftest.py").write_text(SHIM)
    return root


def _outcomes(root: Path) -> dict[str, tuple[str, str]]:
    """Runs pytest in ``root``: test id -> (outcome, first line of the failure)."""
    report = root / "report.xml"
    env = dict(os.environ, FASTENSOR_PROFILE="")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "tests",
        ],
        check=False,  # (failures are what is counted)
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                why = (node.get("message") or "").strip().splitlines()[:1]
                why = why[0][:160] if why else ""
                break
        out[test_id] = (outcome, why)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--safetensors", type=Path, help="a checkout of the safetensors repository"
    )
    parser.add_argument(
        "--need", type=int, default=46, help="passes required (default 46)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastensor-compat-") as tmp:
        scratch = Path(tmp)
        tests = _tests_dir(args.safetensors, scratch)
        baseline = _outcomes(_stage(tests, scratch, shim=False))
        shimmed = _outcomes(_stage(tests, scratch, shim=True))
    reference = sorted(t for t, (o, _) in baseline.items() if o == "passed")
    passing = [t for t in reference if shimmed.get(t, ("missing", ""))[0] == "passed"]
    print(
        f"passed on safetensors: {len(reference)}; of those, on fastensor: {len(passing)}"
    )
    for t in reference:
        outcome, why = shimmed.get(t, ("missing", ""))
        if outcome != "passed":
            print(f"  {outcome:7} {t}: {why}")
    for t, (outcome, why) in sorted(shimmed.items()):
        if (
            t not in baseline and outcome == "failed"
        ):  # e.g. a module that fails to import
            print(f"  error   {t}: {why}")
    return 0 if len(passing) >= args.need else 1


if __name__ == "__main__":
    sys.exit(main())
