"""fastensor.transformers against transformers itself: models built locally from configs
(GPT-2 and Llama, no downloads), saved and loaded both ways, one file and sharded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import fastensor  # noqa: E402
import fastensor.errors  # noqa: E402
import fastensor.transformers as ft  # noqa: E402
from _tiny_models import tiny_gpt2, tiny_llama  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    GPT2LMHeadModel,
    LlamaForCausalLM,
)


def gpt2() -> GPT2LMHeadModel:
    return tiny_gpt2()


def llama() -> LlamaForCausalLM:
    return tiny_llama().to(torch.bfloat16)


MODELS = {"gpt2": gpt2, "llama-bf16": llama}


def assert_same_model(ours, theirs, same_path: bool = True) -> None:
    """The same class, config (but its ``_name_or_path`` unless ``same_path``), tensors
    (parameters and every buffer, persistent or not, bit for bit and of the same dtype), tied
    weights, mode and outputs."""
    assert type(ours) is type(theirs)
    a_cfg, b_cfg = ours.config.to_dict(), theirs.config.to_dict()
    if not same_path:
        del a_cfg["_name_or_path"], b_cfg["_name_or_path"]
    assert a_cfg == b_cfg
    assert ours.generation_config.to_dict() == theirs.generation_config.to_dict()
    for kind in ("named_parameters", "named_buffers"):
        a, b = dict(getattr(ours, kind)()), dict(getattr(theirs, kind)())
        assert a.keys() == b.keys(), kind
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].device == b[k].device, k
            assert a[k].requires_grad == b[k].requires_grad, k
            assert torch.equal(a[k], b[k]), k
    a_sd, b_sd = ours.state_dict(), theirs.state_dict()
    assert a_sd.keys() == b_sd.keys()

    def ties(sd):
        by_ptr: dict[int, list[str]] = {}
        for k, v in sd.items():
            by_ptr.setdefault(v.data_ptr(), []).append(k)
        return sorted(sorted(v) for v in by_ptr.values() if len(v) > 1)

    assert ties(a_sd) == ties(b_sd)
    assert [m.training for m in ours.modules()] == [m.training for m in theirs.modules()]
    assert not ours.training
    x = torch.randint(
        0, ours.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5)
    )
    with torch.no_grad():
        assert torch.equal(ours(x).logits, theirs(x).logits)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("shard", [None, "40KB"], ids=["one-file", "sharded"])
def test_from_pretrained_equals_transformers(tmp_path, name, shard):
    model = MODELS[name]()
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(tmp_path, **kwargs)
    index = os.path.exists(tmp_path / "model.safetensors.index.json")
    assert index == bool(shard)
    theirs = type(model).from_pretrained(tmp_path)
    ours = ft.from_pretrained(type(model), tmp_path)
    assert_same_model(ours, theirs)
    if name == "gpt2":
        assert ours.lm_head.weight is ours.transformer.wte.weight


def test_auto_class_and_from_pretrained_kwargs(tmp_path):
    model = llama()
    model.save_pretrained(tmp_path)
    kwargs = {"dtype": torch.float32, "output_attentions": True}
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, **kwargs)
    ours = ft.from_pretrained(AutoModelForCausalLM, tmp_path, **kwargs)
    assert ours.config.output_attentions and ours.dtype == torch.float32
    assert_same_model(ours, theirs)
    ours, info = ft.from_pretrained(LlamaForCausalLM, tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("shard", ["50GB", "40KB"], ids=["one-file", "sharded"])
def test_save_pretrained_loads_in_transformers(tmp_path, name, shard):
    model = MODELS[name]().eval()
    ft.save_pretrained(model, tmp_path / "ours", max_shard_size=shard)
    model.save_pretrained(tmp_path / "theirs", max_shard_size=shard)
    ours_files = sorted(os.listdir(tmp_path / "ours"))
    theirs_files = sorted(os.listdir(tmp_path / "theirs"))
    if shard == "50GB":
        assert ours_files == theirs_files
    else:  # the same kinds of files (the engine cuts the shards at its own places)
        assert {"config.json", "generation_config.json", "model.safetensors.index.json"} <= set(
            ours_files
        )
        assert all(
            re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", f)
            for f in ours_files
            if "model-" in f
        )
    for f in ("config.json", "generation_config.json"):
        assert json.loads((tmp_path / "ours" / f).read_text()) == json.loads(
            (tmp_path / "theirs" / f).read_text()
        )
    if shard == "40KB":
        index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
        theirs_index = json.loads(
            (tmp_path / "theirs" / "model.safetensors.index.json").read_text()
        )
        assert index["weight_map"].keys() == theirs_index["weight_map"].keys()
        assert index["metadata"]["total_size"] == theirs_index["metadata"]["total_size"]
    loaded = type(model).from_pretrained(tmp_path / "ours")
    assert_same_model(loaded, type(model).from_pretrained(tmp_path / "theirs"), same_path=False)


def test_save_replaces_the_other_layout(tmp_path):
    model = gpt2()
    ft.save_pretrained(model, tmp_path, max_shard_size="40KB")
    assert any(f.startswith("model-0") for f in os.listdir(tmp_path))
    ft.save_pretrained(model, tmp_path)
    assert sorted(os.listdir(tmp_path)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    ft.save_pretrained(model, tmp_path, max_shard_size="40KB")
    assert "model.safetensors" not in os.listdir(tmp_path)
    reference = GPT2LMHeadModel.from_pretrained(tmp_path)
    assert_same_model(ft.from_pretrained(GPT2LMHeadModel, tmp_path), reference)


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        ft.from_pretrained(GPT2LMHeadModel, tmp_path / "missing")
    (tmp_path / "config.json").write_text(gpt2().config.to_json_string())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        ft.from_pretrained(GPT2LMHeadModel, tmp_path)
    with pytest.raises(ValueError, match="state_dict"):
        ft.from_pretrained(GPT2LMHeadModel, tmp_path, state_dict={})


def test_a_load_error_reaches_the_caller(tmp_path):
    gpt2().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    with pytest.raises(fastensor.SafetensorError, match="model.safetensors"):
        ft.from_pretrained(GPT2LMHeadModel, tmp_path)


class _Pages:
    """Stands for a load's ``PendingPages``: ``wait`` waits for ``release``."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.release = threading.Event()
        self.fail = fail
        self.done = False

    def wait(self) -> None:
        self.release.wait()
        if self.fail is not None:
            raise self.fail
        self.done = True


def test_weights_in_flight_hand_out_the_tensors_before_their_pages():
    from fastensor.transformers import _WeightsInFlight

    made, pages = threading.Event(), _Pages()

    def load():
        made.wait()
        return {"a": 1}, [pages]

    weights = _WeightsInFlight(load)
    assert not weights.resolved
    made.set()
    assert sorted(weights.items()) == [("a", 1)] and weights.resolved
    assert not pages.done  # the dict answered before the pages came in
    pages.release.set()
    weights.finish()
    assert pages.done
    failing = _WeightsInFlight(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        len(failing)
    late = _Pages(OSError("device failed"))
    failing_late = _WeightsInFlight(lambda: ({"a": 1}, [late]))
    assert len(failing_late) == 1
    late.release.set()
    with pytest.raises(OSError, match="device failed"):
        failing_late.finish()


def test_from_pretrained_returns_once_every_page_is_in(tmp_path, monkeypatch):
    model = gpt2()
    model.save_pretrained(tmp_path)
    seen = []
    real = ft._load_weights

    def load(path, device, engine):
        weights, pending = real(path, device, engine)
        seen.append(pending)
        return weights, pending

    monkeypatch.setattr(ft, "_load_weights", load)
    got = ft.from_pretrained(GPT2LMHeadModel, tmp_path)
    (pending,) = seen
    assert len(pending) == 1 and pending[0].bytes > 0
    pending[0].wait()  # already in: nothing left to wait for
    assert_same_model(got, GPT2LMHeadModel.from_pretrained(tmp_path))


def test_a_file_replaced_while_its_pages_come_in_is_loaded_again(tmp_path, monkeypatch):
    gpt2().save_pretrained(tmp_path)
    calls = []
    real = ft._load_weights

    def load(path, device, engine):
        weights, pending = real(path, device, engine)
        calls.append(path)
        if len(calls) == 1:  # as if the file shrank under the first load's mapping
            shrank = _Pages(fastensor.errors.FileChangedError(f"{path}: the file shrank"))
            shrank.release.set()
            return weights, [shrank]
        return weights, pending

    monkeypatch.setattr(ft, "_load_weights", load)
    got = ft.from_pretrained(GPT2LMHeadModel, tmp_path)
    assert len(calls) == 2
    assert_same_model(got, GPT2LMHeadModel.from_pretrained(tmp_path))


def test_a_later_load_hands_out_the_tensors_and_waits_for_their_pages(tmp_path):
    from fastensor import _engine, _host_load

    path = tmp_path / "t.safetensors"
    tensors = {"a": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(3, 5)}
    fastensor.torch.save_file(tensors, path)
    native = _engine.engine_or_default(None)
    got, pages = _host_load.load_host_later(native, str(path))
    assert pages is not None and pages.bytes >= 4 << 20
    pages.wait()
    pages.wait()
    for k, v in tensors.items():
        assert torch.equal(got[k], v)


def test_import_fastensor_needs_no_framework():
    code = (
        "import sys, fastensor\n"
        "names = ('torch', 'lightning', 'transformers', 'numpy')\n"
        "loaded = [m for m in names if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


def test_a_child_forked_while_pages_come_in_loads_on_its_own(tmp_path):
    from fastensor import _engine, _host_load

    path = tmp_path / "t.safetensors"
    tensors = {f"t{i}": torch.full((1 << 20,), float(i)) for i in range(16)}
    fastensor.torch.save_file(tensors, path)
    native = _engine.engine_or_default(None)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # (cold: the parent's pages take time)
    os.close(fd)
    got, pages = _host_load.load_host_later(native, str(path))
    pid = os.fork()
    if pid == 0:  # the child: its own load, its own turn, whatever the parent's thread holds
        code = 1
        try:
            mine, its_pages = _host_load.load_host_later(native, str(path))
            its_pages.wait()
            # (one element: no parallel kernel, which would not survive the fork)
            code = 0 if mine["t15"][-1].item() == 15.0 else 2
        finally:
            os._exit(code)
    pages.wait()
    for _ in range(300):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        threading.Event().wait(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("the forked child's load hung")
    assert os.waitstatus_to_exitcode(status) == 0
    assert torch.equal(got["t3"], tensors["t3"])
