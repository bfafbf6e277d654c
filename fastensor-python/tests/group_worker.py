"""One rank of a process-group load scenario (run by ``_dist.run_world``; gloo on CPU).

The test writes the checkpoints and ``case.json`` into the scenario's directory: the
locations to load (files or ``s3://`` URLs), the S3 server's environment where there is one.
Every rank loads with ``process_group=`` and compares each tensor bit for bit against a
single-process load of the same checkpoint.

* ``apis``: ``load_file`` (the ways ``broadcast``, ``each`` and ``auto``), ``load_sharded``,
  ``load_into`` of a real ``nn.Module``, ``safe_open`` (``get_tensor``, ``get_tensors``,
  ``get_sharded`` against ``torch.chunk``), and ``from_pretrained`` where the case names a
  model; with ``s3``, rank 0 also checks the bytes the server sent against the checkpoint's.
* ``missing``: rank 1 is given a file that does not exist: every rank raises, naming it.
* ``different``: rank 1 is given another checkpoint: every rank raises before data moves.
* ``corrupt``: a tensor's bytes changed under its checksum (``verify=True``): every rank
  raises ``CorruptError``.
* ``killed``: rank 1 dies in the middle of its reads: every other rank raises
  ``GroupError`` (and prints ``raised GroupError``), nothing hangs.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import _dist
import torch
import torch.distributed as dist


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert a.device.type == "cpu", what
    x, y = a.contiguous(), b.contiguous()
    if x.numel():
        assert torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8)), what


def same_dicts(got: dict, want: dict, what: str) -> None:
    assert list(got) == list(want) or set(got) == set(want), (what, sorted(got), sorted(want))
    for k in want:
        same(got[k], want[k], f"{what}: {k}")


def sent_bytes(server_url: str, reset: bool = False) -> int:
    conn = http.client.HTTPConnection(server_url.removeprefix("http://"), timeout=10)
    conn.request("DELETE" if reset else "GET", "/_faults")
    body = conn.getresponse().read()
    return 0 if reset else int(json.loads(body)["sent_bytes"])


def scenario_apis(case: dict, rank: int, world: int) -> None:
    import fastensor.torch as ft

    pg = dist.group.WORLD
    single, sharded = case["single"], case["sharded"]
    want = ft.load_file(single)
    for way in ("broadcast", "each", "auto"):
        got = ft.load_file(single, process_group=pg, group_read=way)
        same_dicts(got, want, f"load_file {way}")
    want_sh = ft.load_sharded(sharded)
    for way in ("broadcast", "auto"):
        same_dicts(ft.load_sharded(sharded, process_group=pg, group_read=way), want_sh, way)
    some = sorted(want_sh)[::3]
    got = ft.load_sharded(sharded, names=some, process_group=pg, group_read="broadcast")
    same_dicts(got, {k: want_sh[k] for k in some}, "load_sharded names")

    # load_into a real module, strict, through the group.
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32).to(torch.float16)
    )
    saved = case["module"]
    torch.manual_seed(1000 + rank)  # every rank starts from other values
    for p in model.parameters():
        torch.nn.init.normal_(p)
    result = ft.load_into(model, saved, process_group=pg, group_read="broadcast")
    assert result.missing_keys == [] and result.unexpected_keys == [], result
    want_mod = ft.load_file(saved)
    same_dicts(model.state_dict(), want_mod, "load_into")

    with ft.safe_open(single, framework="pt", process_group=pg, group_read="broadcast") as f:
        names = f.keys()
        for n in names[:5]:
            same(f.get_tensor(n), want[n], f"get_tensor {n}")
        same_dicts(f.get_tensors(), want, "get_tensors")
        for n in names:
            t = want[n]
            for dim in range(t.dim()):
                part = f.get_sharded(n, dim)
                chunks = torch.chunk(t, world, dim) if t.shape[dim] else ()
                if rank < len(chunks):
                    same(part, chunks[rank], f"get_sharded {n} dim {dim}")
                else:
                    assert part.shape[dim] == 0, (n, dim, part.shape)

    if case.get("s3"):
        check_served(case, rank, world)
    if case.get("model"):
        import fastensor.transformers as ftr
        from transformers import AutoModelForCausalLM

        ours = ftr.from_pretrained(AutoModelForCausalLM, case["model"], process_group=pg)
        theirs = ftr.from_pretrained(AutoModelForCausalLM, case["model"])
        same_dicts(ours.state_dict(), theirs.state_dict(), "from_pretrained")
    print(f"rank {rank}: apis ok", flush=True)


def check_served(case: dict, rank: int, world: int) -> None:
    """The bytes the server sends for a group load: the checkpoint once, plus one header
    read per rank; for ``get_sharded`` of one tensor by every rank: that tensor once."""
    import fastensor.torch as ft

    pg = dist.group.WORLD
    server, single = case["server"], case["single"]
    size = case["single_size"]
    dist.barrier()
    if rank == 0:
        sent_bytes(server, reset=True)
    dist.barrier()
    with ft.safe_open(single, framework="pt"):
        pass
    dist.barrier()
    header = sent_bytes(server) / world if rank == 0 else 0
    dist.barrier()
    if rank == 0:
        sent_bytes(server, reset=True)
    dist.barrier()
    ft.load_file(single, process_group=pg, group_read="broadcast")
    dist.barrier()
    if rank == 0:
        served = sent_bytes(server)
        limit = 1.05 * size + world * header
        print(f"served {served} for {size} ({world} ranks, header {header:.0f})", flush=True)
        assert served <= limit, (served, limit)
        sent_bytes(server, reset=True)
    dist.barrier()
    with ft.safe_open(single, framework="pt", process_group=pg) as f:
        big = case["big"]
        f.get_sharded(big, 0)
        dist.barrier()
        if rank == 0:
            served = sent_bytes(server)
            print(f"get_sharded served {served} for {case['big_size']}", flush=True)
            assert served <= case["big_size"] + world * header, served
    dist.barrier()


def expect_raise(fn, cls, *words) -> BaseException:
    try:
        fn()
    except cls as exc:
        for w in words:
            assert w in str(exc), (w, str(exc))
        return exc
    raise AssertionError(f"no {cls.__name__} raised")


def scenario_missing(case: dict, rank: int, world: int) -> None:
    import fastensor.torch as ft

    path = case["single"] if rank != 1 else case["single"] + ".nowhere"
    exc = expect_raise(
        lambda: ft.load_file(path, process_group=dist.group.WORLD), FileNotFoundError
    )
    if rank != 1:
        assert "rank 1" in str(exc), str(exc)
    print(f"rank {rank}: raised {type(exc).__name__}: {exc}", flush=True)


def scenario_different(case: dict, rank: int, world: int) -> None:
    import fastensor.torch as ft

    path = case["single"] if rank != 1 else case["module"]
    exc = expect_raise(
        lambda: ft.load_file(path, process_group=dist.group.WORLD), ValueError, "different"
    )
    print(f"rank {rank}: raised {type(exc).__name__}: {exc}", flush=True)


def scenario_corrupt(case: dict, rank: int, world: int) -> None:
    import fastensor.torch as ft
    from fastensor.errors import CorruptError

    exc = expect_raise(
        lambda: ft.load_file(
            case["corrupt"], process_group=dist.group.WORLD, verify=True, group_read="broadcast"
        ),
        CorruptError,
        case["corrupt_tensor"],
    )
    print(f"rank {rank}: raised {type(exc).__name__}: {exc}", flush=True)


def scenario_killed(case: dict, rank: int, world: int) -> None:
    import fastensor._native as native
    import fastensor.torch as ft
    from fastensor.errors import GroupError

    if rank == 1:
        real = native.read_spans

        def dying(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        native.read_spans = dying
    started = time.monotonic()
    exc = expect_raise(
        lambda: ft.load_file(
            case["single"], process_group=dist.group.WORLD, group_read="broadcast"
        ),
        GroupError,
        case["single"],
    )
    print(f"rank {rank}: raised GroupError in {time.monotonic() - started:.1f} s: {exc}")


def scenario_no_memory(case: dict, rank: int, world: int) -> None:
    import fastensor._group as group
    import fastensor.torch as ft

    if rank == 1:

        def no_memory(*args, **kwargs):
            raise MemoryError("no memory for the tensors (test)")

        group.new_tensors = no_memory
    exc = expect_raise(
        lambda: ft.load_file(
            case["single"], process_group=dist.group.WORLD, group_read="broadcast"
        ),
        Exception,
        "no memory",
    )
    if rank != 1:
        assert "rank 1" in str(exc), str(exc)
    print(f"rank {rank}: raised {type(exc).__name__}: {exc}", flush=True)


SCENARIOS = {
    "no_memory": scenario_no_memory,
    "apis": scenario_apis,
    "missing": scenario_missing,
    "different": scenario_different,
    "corrupt": scenario_corrupt,
    "killed": scenario_killed,
}


def run(scenario: str, directory: Path, rank: int, world: int) -> None:
    case = json.loads((directory / "case.json").read_text())
    os.environ.update(case.get("env", {}))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    SCENARIOS[scenario](case, rank, world)
    if scenario != "killed":  # (a group with a dead rank cannot meet again)
        dist.barrier()
        dist.destroy_process_group()


def entry(scenario: str, directory: str, rank: int, world: int, port: int, log: str) -> None:
    """A forked rank's entry (see ``_dist.logged_entry``)."""
    _dist.logged_entry(run, scenario, directory, rank, world, port, log)
