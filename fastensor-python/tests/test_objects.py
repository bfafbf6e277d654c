"""Checkpoints in object storage (``s3://``, ``gs://`` and ``az://`` URLs), against servers
on the loopback interface (``_s3.py`` says which): every API a trainer uses gives the same
tensors as the local file path, on every store, and faults end in a retry that succeeds or
a typed error, never a partial tensor or a visible partial object. Each test runs once per
store (``server``'s parameter)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import fastensor
import fastensor.torch as ft
import pytest
import torch
from _s3 import AZ_ACCOUNT, BUCKET, server_binary
from fastensor import _native

pytestmark = pytest.mark.skipif(
    server_binary() is None, reason="no S3 server (FASTENSOR_S3_SERVER unset)"
)


def needs_faults(server) -> None:
    if not server.faults:
        pytest.skip(f"{server.scheme}://'s emulator (Azurite) has no fault injection")


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed": torch.randn(1000, 3000, generator=g),  # 12 MB: several requests
        "bias": torch.randn(7, generator=g).to(torch.float16),
        "empty": torch.empty(0, 4),
        "ids": torch.arange(91, dtype=torch.int64).reshape(7, 13),
        "norm": torch.randn(1000, 1000, generator=g).to(torch.bfloat16),
    }


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(got[k], want[k]), k


def test_files_load_and_save_bit_exact_against_the_local_path(server, tmp_path):
    t = tensors()
    local = tmp_path / "m.safetensors"
    ft.save_file(t, local, {"step": "7"}, checksum=True)
    ft.save_file(t, server.url("m.safetensors"), {"step": "7"}, checksum=True)
    assert server.read("m.safetensors") == local.read_bytes()
    assert server.uploads_left() == []

    assert_equal(ft.load_file(server.url("m.safetensors")), t)
    assert_equal(ft.load_file(server.url("m.safetensors"), verify=True), t)
    assert_equal(ft.load_selected(server.url("m.safetensors"), ["ids"]), {"ids": t["ids"]})

    into = {k: torch.full_like(v, 3) for k, v in t.items()}
    ft.load_into(into, server.url("m.safetensors"))
    assert_equal(into, t)

    with ft.safe_open(server.url("m.safetensors"), framework="pt") as f:
        assert f.metadata()["step"] == "7"
        assert sorted(f.keys()) == sorted(t)
        assert torch.equal(f.get_tensor("bias"), t["bias"])
        assert torch.equal(f.get_slice("embed")[10:20, ::7], t["embed"][10:20, ::7])
        assert torch.equal(f.get_slice("norm")[-3:], t["norm"][-3:])


def test_background_saves_and_verification_of_objects(server):
    t = tensors()
    handle = ft.save_file_async(t, server.url("async.safetensors"), checksum=True)
    handle.wait()
    assert handle.path == server.url("async.safetensors")  # a str: pathlib would fold s3://
    assert_equal(ft.load_file(server.url("async.safetensors")), t)
    tensors_checked, _ = fastensor.verify_file(server.url("async.safetensors"))
    assert tensors_checked == len(t)


def test_sharded_checkpoints_under_a_prefix(server):
    t = tensors()
    ft.save_sharded(t, server.url("sharded"), max_shard_size="5MB")
    assert server.exists("sharded/model.safetensors.index.json")
    assert fastensor.torch.is_sharded(server.url("sharded"))
    assert not fastensor.torch.is_sharded(server.url("sharded/model-00001-of-00003.safetensors"))
    for where in ("sharded", "sharded/", "sharded/model.safetensors.index.json"):
        assert_equal(ft.load_sharded(server.url(where)), t)
    into = {k: torch.zeros_like(v) for k, v in t.items()}
    ft.load_into(into, server.url("sharded"))
    assert_equal(into, t)


@pytest.mark.parametrize("kind", ["slow_down", "internal_error", "drop", "truncate"])
def test_faults_on_loads_are_retried(server, kind):
    needs_faults(server)
    t = tensors()
    ft.save_file(t, server.url("f.safetensors"))
    server.fault(kind, "GET", times=3)
    assert_equal(ft.load_file(server.url("f.safetensors")), t)
    assert server.fired(kind) == 3


def test_missing_objects_and_failed_saves(server, monkeypatch):
    with pytest.raises(FileNotFoundError, match=re.escape(server.url("none.safetensors"))):
        ft.load_file(server.url("none.safetensors"))
    with pytest.raises(fastensor.errors.NotFoundError):
        ft.safe_open(server.url("none.safetensors"), framework="pt")
    # A server that keeps failing: the save is an error naming the object, and leaves no
    # object and no parts (an engine made now reads FASTENSOR_S3_RETRIES).
    needs_faults(server)
    monkeypatch.setenv("FASTENSOR_S3_RETRIES", "1")
    engine = fastensor.Engine()
    server.fault("internal_error", "PUT", times=1000)
    with pytest.raises(OSError, match=re.escape(server.url("fail.safetensors"))):
        ft.save_file(tensors(), server.url("fail.safetensors"), engine=engine)
    server.clear()
    assert not server.exists("fail.safetensors")
    assert server.uploads_left() == []


def test_the_cli_copies_between_objects_and_files(server, tmp_path):
    t = tensors()
    ft.save_file(t, server.url("c.safetensors"))
    cli = os.environ.get("FASTENSOR_CLI")
    if not cli:
        pytest.skip("no fastensor binary (FASTENSOR_CLI unset)")
    local = tmp_path / "c.safetensors"
    env = dict(os.environ)
    subprocess.run(
        [cli, "ckpt", "copy", server.url("c.safetensors"), str(local)], check=True, env=env
    )
    assert_equal(ft.load_file(local), t)
    out = subprocess.run(
        [cli, "ckpt", "inspect", server.url("c.safetensors")],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert "embed" in out and "F32" in out


def test_dcp_saves_and_loads_on_two_ranks(server, tmp_path):
    from _dist import run_world

    (tmp_path / "s3.json").write_text(
        json.dumps({"env": server.env(), "url": server.url("dcp/step-1")})
    )
    run_world("s3", 2, tmp_path)
    names = _native.list_names(fastensor._engine.engine_or_default(None), server.url("dcp/step-1"))
    assert ".fastensor_metadata" in names
    assert sum(n.endswith(".safetensors") for n in names) == 2
    assert server.uploads_left() == []


def test_transformers_from_pretrained_of_a_prefix(server, tmp_path):
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.dirname(__file__))
    import fastensor.transformers as ftr
    from _tiny_models import tiny_gpt2

    model = tiny_gpt2()
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    engine = fastensor._engine.engine_or_default(None)
    for name in os.listdir(tmp_path):
        _native.write_whole(engine, server.url(f"gpt2/{name}"), (tmp_path / name).read_bytes())
    ours = ftr.from_pretrained(type(model), server.url("gpt2"))
    assert ours.config.name_or_path == server.url("gpt2")
    theirs = type(model).from_pretrained(tmp_path)
    ours_sd, theirs_sd = ours.state_dict(), theirs.state_dict()
    assert ours_sd.keys() == theirs_sd.keys()
    for k in ours_sd:
        a, b = ours_sd[k], theirs_sd[k]
        assert torch.equal(a, b), k
    assert ours.lm_head.weight is ours.transformer.wte.weight


def test_a_forked_child_loads_objects_with_clients_of_its_own(server):
    t = tensors()
    ft.save_file(t, server.url("fork.safetensors"))
    assert_equal(ft.load_file(server.url("fork.safetensors")), t)  # the parent's clients exist
    pid = os.fork()
    if pid == 0:  # the child: the parent's I/O threads are not here
        code = 1
        try:
            # (compared as bytes through numpy: torch's OpenMP pool does not survive a fork)
            got = ft.load_file(server.url("fork.safetensors"))
            same = all(
                (
                    got[k].reshape(-1).view(torch.uint8).numpy()
                    == v.reshape(-1).view(torch.uint8).numpy()
                ).all()
                for k, v in t.items()
            )
            code = 0 if same and got.keys() == t.keys() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert_equal(ft.load_file(server.url("fork.safetensors")), t)  # and the parent's still work


def _boto3_client(server):
    import boto3

    env = server.env()
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_REGION"],
    )


class _OwnTool:
    """The store's own way in, not fastensor's: boto3 for S3; plain HTTP to the XML API for
    GCS (unauthenticated, as its emulator takes it); Azure's REST API (shared-key signed)
    for Azure."""

    def __init__(self, server):
        self.server = server
        self.s3 = _boto3_client(server) if server.scheme == "s3" else None

    def _gcs(self, method: str, key: str, body: bytes = b"") -> bytes:
        import http.client
        import urllib.parse

        host = self.server.url_base.removeprefix("http://")
        conn = http.client.HTTPConnection(host, timeout=30)
        conn.request(method, f"/{BUCKET}/{urllib.parse.quote(key)}", body=body)
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status == 200, (resp.status, data[:200])
        return data

    def get(self, key: str) -> bytes:
        if self.s3 is not None:
            return self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        if self.server.scheme == "gs":
            return self._gcs("GET", key)
        return self.server.read(key)

    def put(self, key: str, data: bytes) -> None:
        if self.s3 is not None:
            self.s3.put_object(Bucket=BUCKET, Key=key, Body=data)
        elif self.server.scheme == "gs":
            self._gcs("PUT", key, data)
        else:
            self.server.write(key, data)


@pytest.mark.parametrize(
    "key",
    [
        "exp#3/m.safetensors",
        "run[lr=1e-4]/m.safetensors",
        "with space/100%/m.safetensors",
        "a%2Fb/c+d/m.safetensors",
    ],
)
def test_object_keys_round_trip_with_the_stores_own_tools_both_ways(server, key):
    tool = _OwnTool(server)
    t = {"ids": tensors()["ids"], "bias": tensors()["bias"]}
    ft.save_file(t, server.url(key))  # ours, read by the store's tool under the same key
    body = tool.get(key)
    assert body == server.read(key)
    assert_equal(ft.load(body), t)
    if tool.s3 is not None:
        assert tool.s3.head_object(Bucket=BUCKET, Key=key)["ContentLength"] == len(body)
    engine = fastensor._engine.engine_or_default(None)
    assert _native.list_names(engine, server.url(key.rsplit("/", 1)[0])) == ["m.safetensors"]
    other = key.replace("m.safetensors", "boto.safetensors")
    tool.put(other, body)  # the tool's, read by us
    assert_equal(ft.load_file(server.url(other)), t)
    with ft.safe_open(server.url(other), framework="pt") as f:
        assert torch.equal(f.get_tensor("ids"), t["ids"])


def test_keys_with_empty_segments_round_trip_with_the_stores_own_tools_both_ways(server):
    tool = _OwnTool(server)
    t = {"ids": tensors()["ids"]}
    u = {"ids": tensors()["ids"] + 1}
    ft.save_file(t, server.url("a/m.safetensors"))
    ft.save_file(u, server.url("a//m.safetensors"))  # another object than a/m
    body = tool.get("a//m.safetensors")
    assert_equal(ft.load(body), u)
    assert_equal(ft.load_file(server.url("a/m.safetensors")), t)
    tool.put("b//c///boto.safetensors", body)
    assert_equal(ft.load_file(server.url("b//c///boto.safetensors")), u)
    with ft.safe_open(server.url("b//c///boto.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor("ids"), u["ids"])
    # Listing such a prefix is refused, naming it (the objects stay reachable by URL).
    engine = fastensor._engine.engine_or_default(None)
    with pytest.raises(ValueError, match=r"empty segment.*: " + re.escape(server.url("a//")) + " "):
        _native.list_names(engine, server.url("a//"))


def test_keys_the_store_cannot_name_are_refused_naming_the_key(server):
    t = {"ids": tensors()["ids"]}
    ft.save_file(t, server.url("a/m.safetensors"))
    for key in ["a/./m.safetensors", "a/../m.safetensors", "/m.safetensors"]:
        with pytest.raises(ValueError, match=re.escape(server.url(key))):
            ft.save_file(t, server.url(key))
        with pytest.raises(ValueError, match="refused rather than changed"):
            ft.load_file(server.url(key))
    assert_equal(ft.load_file(server.url("a/m.safetensors")), t)


def test_save_pretrained_to_a_prefix_touches_no_local_path(server, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.dirname(__file__))
    import fastensor.transformers as ftr
    from _tiny_models import tiny_gpt2

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    model = tiny_gpt2()
    engine = fastensor._engine.engine_or_default(None)
    ftr.save_pretrained(model, server.url("gpt"), max_shard_size="40KB")
    names = _native.list_names(engine, server.url("gpt"))
    assert {"config.json", "generation_config.json", "model.safetensors.index.json"} <= set(names)
    ours = ftr.from_pretrained(type(model), server.url("gpt"))
    assert ours.config.n_embd == model.config.n_embd
    want = model.state_dict()
    for k, v in ours.state_dict().items():
        assert torch.equal(v, want[k]), k
    # Saved again as one file: the shards and their index are gone from the prefix.
    ftr.save_pretrained(model, server.url("gpt"))
    names = _native.list_names(engine, server.url("gpt"))
    assert sorted(names) == ["config.json", "generation_config.json", "model.safetensors"]
    ours = ftr.from_pretrained(type(model), server.url("gpt"))
    for k, v in ours.state_dict().items():
        assert torch.equal(v, want[k]), k
    assert list(cwd.iterdir()) == []


def test_a_handle_opened_before_fork_raises_in_the_child_and_nothing_hangs(server, tmp_path):
    t = tensors()
    ft.save_file(t, server.url("inherited.safetensors"))
    script = f"""
import os, sys, time
import fastensor, fastensor.torch as ft
with ft.safe_open({server.url("inherited.safetensors")!r}, framework="pt") as f:
    f.get_tensor("ids")  # the parent's clients and I/O threads exist
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            f.get_tensor("ids")
            code = 0  # (working in the child is as good as an error)
        except fastensor.FastensorError as e:
            code = 0 if "fork" in str(e) else 4
            print(type(e).__name__, e, file=sys.stderr)
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            sys.exit("the child hung on a handle opened before fork()")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0, status
    assert f.get_tensor("ids").sum().item() == {int(t["ids"].sum())}  # still works here
print("parent done")
"""
    env = dict(os.environ, FASTENSOR_PROFILE="")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "parent done" in out.stdout


def test_abfs_urls_name_the_blobs_az_urls_name(object_stores):
    """``abfs://container@account.dfs.core.windows.net/key`` (Azure Data Lake's spelling,
    the account in the URL) reaches the same blobs as ``az://container/key``."""
    if "az" not in object_stores:
        pytest.skip("no Azurite (FASTENSOR_AZURITE unset)")
    az = object_stores["az"]

    def abfs(key: str) -> str:
        return f"abfs://{BUCKET}@{AZ_ACCOUNT}.dfs.core.windows.net/{key}"

    t = tensors()
    ft.save_file(t, az.url("abfs/m.safetensors"))
    assert_equal(ft.load_file(abfs("abfs/m.safetensors")), t)
    ft.save_sharded(t, abfs("abfs/sharded"), max_shard_size="5MB")
    assert_equal(ft.load_sharded(az.url("abfs/sharded")), t)
    with pytest.raises(ValueError, match="container@account"):
        ft.load_file("abfs://no-account/m.safetensors")
