"""Loads by the ranks of a ``torch.distributed`` process group (``process_group=``): real
gloo processes on the CPU, 1 to 4 ranks, local files, sharded checkpoints and objects
(``s3://``, ``gs://``, ``az://`` on the local servers of ``_s3.py``); every rank's tensors
bit for bit against a single-process load, the bytes the server sends (where it counts
them), and the faults (see ``group_worker.py``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(__file__))

import fastensor  # noqa: E402
import fastensor.torch as ft  # noqa: E402
from _dist import run_world  # noqa: E402


def checkpoint_tensors() -> dict[str, torch.Tensor]:
    """Uneven sizes, empty tensors, one tensor larger than all the others together, and
    dtypes of every width."""
    g = torch.Generator().manual_seed(11)
    out = {
        "big": torch.randn(768, 1024, generator=g),  # 3 MiB: more than the rest together
        "empty": torch.empty(0, 5),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "bool": torch.rand(333, generator=g) > 0.5,
        "u8": torch.randint(0, 255, (1001,), generator=g, dtype=torch.uint8),
        "i8": torch.randint(-128, 127, (7, 13), generator=g, dtype=torch.int8),
        "i16": torch.randint(-1000, 1000, (257,), generator=g, dtype=torch.int16),
        "f16": torch.randn(3, 333, generator=g).half(),
        "bf16": torch.randn(129, 65, generator=g).bfloat16(),
        "i32": torch.randint(-(2**31), 2**31 - 1, (4097,), generator=g, dtype=torch.int32),
        "f64": torch.randn(100, 3, generator=g, dtype=torch.float64),
        "i64": torch.randint(-(2**62), 2**62, (33,), generator=g, dtype=torch.int64),
        "f8": torch.randn(64, 17, generator=g).to(torch.float8_e4m3fn),
        "nan": torch.tensor([float("nan"), -0.0, float("inf")]),
        "empty2": torch.zeros(3, 0, dtype=torch.int32),
    }
    for i in range(40):  # many small tensors, coalesced into few messages
        out[f"small.{i}"] = torch.randn(5 + i, generator=g)
    out["mid"] = torch.randn(300, 700, generator=g)
    return out


def module_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(5)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32).to(torch.float16)
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def write_case(d: Path, where, extra: dict | None = None, engine=None) -> dict:
    """Saves the checkpoints through ``where(name)`` (a path or URL; through ``engine`` when
    given) and writes case.json."""
    t = checkpoint_tensors()
    ft.save_file(t, where("single.safetensors"), engine=engine)
    ft.save_sharded(t, where("sharded"), max_shard_size="1MB", engine=engine)
    ft.save_file(module_state(), where("module.safetensors"), engine=engine)
    corrupt = d / "corrupt.safetensors"
    ft.save_file(t, corrupt, checksum=True)
    with ft.safe_open(corrupt, framework="pt") as f:
        start = {e[0]: e[3] for e in f._file.entries()}["mid"]
    with open(corrupt, "r+b") as fh:
        fh.seek(start + 1000)
        fh.write(b"\xff\xfe\xfd\xfc")
    case = {
        "single": where("single.safetensors"),
        "sharded": where("sharded"),
        "module": where("module.safetensors"),
        "corrupt": str(corrupt),
        "corrupt_tensor": "mid",
        "big": "big",
        "big_size": t["big"].numel() * 4,
    }
    case.update(extra or {})
    (d / "case.json").write_text(json.dumps(case))
    return case


@pytest.fixture(scope="module")
def local_case(tmp_path_factory):
    d = tmp_path_factory.mktemp("group-local")
    from _tiny_models import tiny_gpt2

    model = tiny_gpt2()
    model.save_pretrained(d / "gpt2", max_shard_size="40KB")
    write_case(d, lambda n: str(d / n), {"model": str(d / "gpt2")})
    return d


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_api_loads_bit_exact_on_every_rank_from_files(local_case, world):
    out = run_world("apis", world, local_case, timeout=300, worker="group_worker")
    assert all("apis ok" in o for o in out)


@pytest.fixture(scope="module", params=["s3", "gs", "az"])
def object_case(request, tmp_path_factory):
    """A case under an object prefix of each store (``_s3.py`` says which servers); where
    the server counts the bytes it sends (s3, gs), rank 0 checks them too."""
    from _s3 import Azurite, S3Server, azurite_binary, server_binary, serving

    binary = server_binary()
    if binary is None:
        pytest.skip("no S3 test server (FASTENSOR_S3_SERVER)")
    d = tmp_path_factory.mktemp(f"group-{request.param}")
    if request.param == "az":
        if azurite_binary() is None:
            pytest.skip("no Azurite (FASTENSOR_AZURITE unset)")
        server = Azurite(azurite_binary(), d / "server")
    else:
        server = S3Server(binary, d / "server", anonymous=request.param == "gs")
    with serving(server):
        url = lambda n: server.url(f"group/{n}")  # noqa: E731
        # An engine of its own: the default engine's clients stay unmade for other tests.
        engine = fastensor.Engine()
        extra = {"s3": server.faults, "env": server.env(), "model": url("gpt2")}
        if server.faults:
            extra["server"] = server.url_base
        case = write_case(d, url, extra, engine=engine)
        from _tiny_models import tiny_gpt2

        tiny_gpt2().save_pretrained(d / "gpt2", max_shard_size="40KB")
        native = fastensor._engine.engine_or_default(engine)
        for name in os.listdir(d / "gpt2"):
            data = (d / "gpt2" / name).read_bytes()
            fastensor._native.write_whole(native, url(f"gpt2/{name}"), data)
        case["single_size"] = len(server.read("group/single.safetensors"))
        (d / "case.json").write_text(json.dumps(case))
        yield d


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_api_loads_bit_exact_from_objects_each_byte_served_once(object_case, world):
    out = run_world("apis", world, object_case, timeout=300, worker="group_worker")
    assert all("apis ok" in o for o in out)
    if json.loads((object_case / "case.json").read_text())["s3"]:
        assert "served" in out[0]


@pytest.mark.parametrize("scenario", ["missing", "different", "corrupt", "no_memory"])
def test_a_failing_rank_makes_every_rank_raise(local_case, scenario):
    out = run_world(scenario, 3, local_case, timeout=120, worker="group_worker")
    assert all("raised" in o for o in out), out


def test_a_killed_rank_makes_the_others_raise_without_hanging(local_case):
    out = run_world(
        "killed", 3, local_case, timeout=120, worker="group_worker", may_die=frozenset({1})
    )
    for r in (0, 2):
        assert "raised GroupError" in out[r], out[r]


def test_group_read_and_its_switch_are_checked():
    from fastensor import _group

    assert _group.way_asked(None) in _group.WAYS
    with pytest.raises(ValueError, match="group_read"):
        _group.way_asked("scatter")
