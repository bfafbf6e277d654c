#!/usr/bin/env python3
"""The declared minimum Rust version (`rust-version`) holds: run by .ci/run.

A crate's `rust-version` promises that it builds with that toolchain. Three checks keep the
promise honest with the tools at hand:

1. every dependency a user builds (normal and build dependencies of the workspace's crates
   and of the Python extension, all features, this lockfile) declares a `rust-version` no
   newer than the crate that depends on it: a newer one would make the promise false
   whatever our own code does;
2. our own code uses no standard-library API newer than the promise: clippy's
   `incompatible_msrv` lint (on by default, and CI runs clippy with `-D warnings`);
3. the workspace is built with the toolchain of the declared version when one is installed
   (`rustup toolchain list`); where only a newer toolchain is installed this is said, and
   checks 1 and 2 stand for it.

Usage: scripts/check-msrv.py [--build]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Manifests with a `rust-version` of their own (the workspace, the Python extension).
MANIFESTS = [ROOT / "Cargo.toml", ROOT / "fastensor-python" / "Cargo.toml"]


def version(text: str) -> tuple[int, int, int]:
    """`1.88` or `1.88.0` as (1, 88, 0)."""
    parts = [int(x) for x in re.findall(r"\d+", text)[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def metadata(manifest: Path) -> dict:
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
        cwd=manifest.parent,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def too_new(meta: dict) -> list[str]:
    """Each dependency reached by normal or build edges from a workspace member whose
    `rust-version` is newer than that member's, as a line naming both."""
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    problems = []
    for member in meta["workspace_members"]:
        declared = packages[member].get("rust_version")
        if not declared:
            continue
        seen, stack = set(), [member]
        while stack:
            node = nodes[stack.pop()]
            for dep in node["deps"]:
                kinds = {k["kind"] for k in dep["dep_kinds"]}
                if kinds <= {"dev"} or dep["pkg"] in seen:
                    continue
                seen.add(dep["pkg"])
                stack.append(dep["pkg"])
        for dep in seen:
            p = packages[dep]
            if p["id"] in meta["workspace_members"]:
                continue
            wanted = p.get("rust_version")
            if wanted and version(wanted) > version(declared):
                problems.append(
                    f"{packages[member]['name']} declares rust-version {declared}, "
                    f"but {p['name']} {p['version']} needs {wanted}"
                )
    return sorted(set(problems))


def main(argv: list[str]) -> int:
    problems = []
    declared = set()
    for manifest in MANIFESTS:
        meta = metadata(manifest)
        problems += too_new(meta)
        for member in meta["workspace_members"]:
            v = next(p for p in meta["packages"] if p["id"] == member).get(
                "rust_version"
            )
            if v:
                declared.add(v)
    for line in problems:
        print(f"check-msrv: {line}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"check-msrv: every dependency builds with the declared rust-version ({', '.join(sorted(declared))})"
    )
    if "--build" in argv:
        listed = subprocess.run(
            ["rustup", "toolchain", "list"], capture_output=True, text=True, check=False
        ).stdout
        for v in sorted(declared):
            if re.search(rf"^{re.escape(v)}(\.0)?-", listed, re.MULTILINE):
                print(f"== cargo +{v} build --workspace --locked")
                subprocess.run(
                    ["cargo", f"+{v}", "build", "--workspace", "--locked"],
                    cwd=ROOT,
                    check=True,
                )
            else:
                print(
                    f"check-msrv: no {v} toolchain installed (only a newer one can be had "
                    "here): its build is not run; checks 1 and 2 stand for it"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
