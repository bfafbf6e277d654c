"""Helpers the benchmarks share: touching every page, making files durable, dropping the
page cache, formatting a ratio."""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path


def touch(tensors: Iterable) -> int:
    """Reads one byte of every page of every CPU tensor (lazily mapped data is read in)."""
    import torch

    s = 0
    for t in tensors:
        if t.numel() and t.device.type == "cpu":
            s += int(t.detach().reshape(-1).view(torch.uint8)[::4096].sum())
    return s


def fsync_paths(paths: Iterable[str | os.PathLike]) -> None:
    """fsyncs each file or directory of ``paths``."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def durable(path: str | os.PathLike) -> None:
    """Makes the file at ``path`` and its directory entry durable."""
    fsync_paths([path, os.path.dirname(os.path.abspath(path))])


def fsync_tree(path: str | os.PathLike) -> None:
    """fsyncs every file and directory under ``path`` (a file or a directory) and its
    parent directory."""
    paths = [os.path.dirname(os.path.abspath(path))]
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            paths.append(root)
            paths += [os.path.join(root, f) for f in files]
    else:
        paths.append(path)
    fsync_paths(paths)


def scratch(prefix: str, parent: str | None) -> Path:
    """A new scratch directory for one run, under ``parent`` (made if missing) or the
    system's temporary directory."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def files_under(directory: str | os.PathLike) -> list[str]:
    """Every file under ``directory``."""
    return [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names]


def drop_file_cache(files: Iterable[str | os.PathLike]) -> None:
    """Writes back, then drops, the page cache of each file of ``files``."""
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def drop_caches(files: Iterable[str | os.PathLike]) -> str:
    """Drops the page cache: all of it where permitted, else the files'; says which."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return "dropped (/proc/sys/vm/drop_caches)"
    except OSError:
        drop_file_cache(files)
        return "files' pages dropped (POSIX_FADV_DONTNEED; the libraries stay cached)"


def subjects(**groups: dict[str, str]) -> dict[str, tuple[str, str]]:
    """A bench's subjects, given per group as ``{name: description}``, as
    ``{name: (group, description)}`` in the order given."""
    return {name: (group, what) for group, named in groups.items() for name, what in named.items()}


def interleaved(names: Iterable[str], rounds: int, seed: int) -> Iterator[tuple[int, list[str]]]:
    """``(round, names)`` for each of ``rounds`` rounds, the names in a new random order each
    round (seeded: a run can be repeated)."""
    rng = random.Random(seed)
    for r in range(rounds):
        order = list(names)
        rng.shuffle(order)
        yield r, order


def paired(
    pairs: Iterable[tuple[str, str]], rounds: int, seed: int
) -> Iterator[tuple[int, list[str]]]:
    """``(round, names)`` for each of ``rounds`` rounds: the pairs in a new random order each
    round, the two names of a pair back to back in a random order (seeded), so that the two
    sides of a comparison meet the disk in the same phase."""
    rng = random.Random(seed)
    pairs = list(pairs)
    for r in range(rounds):
        order = list(pairs)
        rng.shuffle(order)
        flat = []
        for pair in order:
            pair = list(pair)
            rng.shuffle(pair)
            flat += pair
        yield r, flat


def write_report(out: Path | None, text: str) -> None:
    """Writes ``text`` to ``out`` (when given) under the command line that made it."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        script = os.path.relpath(os.path.abspath(sys.argv[0]))
        cmd = " ".join(["python", script, *sys.argv[1:]])
        out.write_text(f"`{cmd}`\n\n{text}")


def fmt_ratio(values: list[float]) -> str:
    """The median of per-round ratios, bold, with their range."""
    return f"**{statistics.median(values):.2f}x** ({min(values):.2f}-{max(values):.2f})"
