"""fastensor.lightning.CheckpointIO with a real Lightning Trainer: fit, checkpoint through
ModelCheckpoint, resume with ckpt_path=, against Lightning's default TorchCheckpointIO."""

from __future__ import annotations

import io
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")

import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
from conftest import leftovers  # noqa: E402
from fastensor.errors import FastensorError  # noqa: E402
from fastensor.lightning import (  # noqa: E402
    SKELETON,
    CheckpointIO,
    load_checkpoint,
    save_checkpoint,
    save_checkpoint_async,
)
from fastensor.lightning import AsyncCheckpointIO as OwnAsyncCheckpointIO  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def assert_same(a, b, where: str = "checkpoint", attrs: bool = True) -> None:
    """``a`` and ``b`` equal all the way down: the same container types and keys (and
    attributes, such as a state dict's ``_metadata``, with ``attrs``), tensors of the same
    type, dtype, shape, device and bits, everything else ``==``."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), where
        assert a.requires_grad == b.requires_grad, where
        if a.is_sparse:
            assert torch.equal(a.to_dense(), b.to_dense()), where
        elif a.is_complex():
            assert torch.equal(torch.view_as_real(a), torch.view_as_real(b)), where
        else:
            assert torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)), where
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}", attrs)
        if attrs and hasattr(a, "__dict__"):
            assert vars(a).keys() == vars(b).keys(), where
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}/{i}", attrs)
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def torch_round_trip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def nested_checkpoint() -> dict:
    g = torch.Generator().manual_seed(0)
    sd = OrderedDict(
        [
            ("layer.weight", torch.randn(8, 4, generator=g)),
            ("layer.bias", torch.randn(8, generator=g).to(torch.bfloat16)),
            ("bn.num_batches_tracked", torch.tensor(7)),
        ]
    )
    sd._metadata = OrderedDict([("", {"version": 1}), ("bn", {"version": 2})])
    score = torch.tensor(0.25)
    shared = [torch.ones(2), (torch.zeros(1), "x")]
    return {
        "shared_a": shared,
        "shared_b": shared,
        "epoch": 3,
        "global_step": 120,
        "pytorch-lightning_version": "2.x",
        "state_dict": sd,
        "optimizer_states": [
            {
                "state": {
                    0: {"step": torch.tensor(5.0), "exp_avg": torch.randn(8, 4, generator=g)}
                },
                "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1]}],
            }
        ],
        "callbacks": {"ModelCheckpoint{...}": {"best_model_score": score, "best_k": {"a": score}}},
        "non_contiguous": torch.randn(4, 6, generator=g).t(),
        "complex": torch.randn(3, dtype=torch.complex128, generator=g),  # in the skeleton
        "sparse": torch.eye(3).to_sparse(),  # in the skeleton
        "mask": torch.rand(5, generator=g) > 0.5,
        "empty": torch.empty(0, 3, dtype=torch.float16),
        "param": torch.nn.Parameter(torch.ones(2)),
        "tuple": (1, "a", torch.arange(3)),
        "hyper_parameters": {"lr": 0.1, "name": "x", "sizes": [1, 2]},
        "slash/in/key": torch.zeros(1),
        "slash": {"in": {"key": torch.ones(1)}},
        SKELETON: "a user key named as the skeleton",
    }


def test_round_trip_equals_torch_save(tmp_path):
    ckpt = nested_checkpoint()
    path = tmp_path / "sub" / "epoch=3.ckpt"
    save_checkpoint(ckpt, path)
    back = load_checkpoint(path, weights_only=False)
    expected = torch_round_trip(ckpt)
    expected["non_contiguous"] = expected["non_contiguous"].contiguous()
    assert_same(back, expected)
    # One tensor referenced twice comes back as one tensor.
    cb = back["callbacks"]["ModelCheckpoint{...}"]
    assert cb["best_model_score"] is cb["best_k"]["a"]
    assert back["shared_a"] is back["shared_b"]  # one list, as torch.load gives it
    assert back["state_dict"]._metadata == ckpt["state_dict"]._metadata
    assert leftovers(path.parent) == []


def test_file_is_one_safetensors_file(tmp_path):
    path = tmp_path / "a.ckpt"
    save_checkpoint(nested_checkpoint(), path)
    assert os.listdir(tmp_path) == ["a.ckpt"]
    with safetensors.safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        assert f.metadata()["fastensor.lightning"] == "1"
        assert torch.equal(
            f.get_tensor("state_dict/layer.weight"),
            nested_checkpoint()["state_dict"]["layer.weight"],
        )
    assert SKELETON in names
    assert "optimizer_states/0/state/0/exp_avg" in names
    assert "complex" not in names  # not a safetensors dtype: in the skeleton


def test_tensors_sharing_memory_are_saved_once_and_stay_shared(tmp_path):
    g = torch.Generator().manual_seed(2)
    wte = torch.randn(10, 4, generator=g)
    whole = torch.randn(6, 8, generator=g)
    halves = torch.randn(2, 5, generator=g)
    ckpt = {
        "state_dict": {"wte.weight": wte, "lm_head.weight": wte.detach()},  # tied
        "whole": whole,
        "rows": whole[2:4],  # a view of `whole`
        "cols_t": whole[:, 1:3].t(),  # a strided view
        "as_int": whole.view(torch.int32)[0],  # another dtype over the same bytes
        "left": halves[0],  # neither covers its memory whole
        "right": halves[1],
    }
    path = tmp_path / "a.ckpt"
    save_checkpoint(ckpt, path)
    with safetensors.safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
    assert names == {"state_dict/wte.weight", "whole", "left#storage", SKELETON}
    for weights_only in (True, False):
        back = load_checkpoint(path, weights_only=weights_only)
        for key in ("whole", "rows", "cols_t", "as_int", "left", "right"):
            assert torch.equal(back[key], ckpt[key]), key
            assert back[key].stride() == ckpt[key].stride(), key
        sd = back["state_dict"]
        assert torch.equal(sd["lm_head.weight"], wte)
        assert sd["lm_head.weight"].data_ptr() == sd["wte.weight"].data_ptr()
        with torch.no_grad():
            back["whole"][2, 0] = 123.0
            back["left"][0] = -7.0
        assert back["rows"][0, 0] == 123.0
        assert (
            back["right"].untyped_storage().data_ptr() == back["left"].untyped_storage().data_ptr()
        )
        assert halves.untyped_storage().nbytes() == back["left"].untyped_storage().nbytes()


def test_weights_only_load(tmp_path):
    ckpt = nested_checkpoint()
    path = tmp_path / "a.ckpt"
    save_checkpoint(ckpt, path)
    back = load_checkpoint(path, weights_only=True)
    expected = torch_round_trip(ckpt)
    expected["non_contiguous"] = expected["non_contiguous"].contiguous()
    assert_same(back, expected)


def test_map_location(tmp_path):
    path = tmp_path / "a.ckpt"
    save_checkpoint({"w": torch.ones(3), "n": 1}, path)
    seen = []

    def to_host(storage, location):
        seen.append(location)
        return storage.cpu()

    assert load_checkpoint(path, map_location="meta")["w"].device.type == "meta"
    assert load_checkpoint(path, map_location={"cpu": "meta"})["w"].device.type == "meta"
    assert load_checkpoint(path, map_location=lambda s, loc: None)["w"].device.type == "cpu"
    assert load_checkpoint(path, map_location=torch.device("cpu"))["w"].device.type == "cpu"
    assert torch.equal(load_checkpoint(path, map_location=to_host)["w"], torch.ones(3))
    assert seen == ["cpu"]


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "a.ckpt"
    save_checkpoint({"w": torch.ones(3)}, path)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        save_checkpoint({"w": torch.zeros(3), "f": lambda: 0}, path)
    assert torch.equal(load_checkpoint(path)["w"], torch.ones(3))
    assert leftovers(tmp_path) == []


def test_loads_lightning_default_checkpoints_and_refuses_others(tmp_path):
    plain = tmp_path / "torch.ckpt"
    TorchCheckpointIO().save_checkpoint({"w": torch.ones(2), "epoch": 1}, plain)
    back = CheckpointIO().load_checkpoint(plain)
    assert back["epoch"] == 1 and torch.equal(back["w"], torch.ones(2))
    other = tmp_path / "other.safetensors"
    safetensors.torch.save_file({"w": torch.ones(2)}, str(other))
    with pytest.raises(ValueError, match="not a Lightning checkpoint"):
        load_checkpoint(other)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.ckpt")


def test_remove_and_storage_options(tmp_path):
    io_ = CheckpointIO()
    path = tmp_path / "a.ckpt"
    io_.save_checkpoint({"w": torch.ones(1)}, path)
    with pytest.raises(TypeError, match="storage_options"):
        io_.save_checkpoint({"w": torch.ones(1)}, path, storage_options={"x": 1})
    io_.remove_checkpoint(path)
    assert not path.exists()
    io_.remove_checkpoint(path)  # nothing there: no error


# -- saves in the background ------------------------------------------------------------


def test_async_save_is_a_snapshot(tmp_path):
    w = torch.arange(1 << 16, dtype=torch.float32)
    ckpt = {"state_dict": OrderedDict(w=w), "epoch": 3}
    handle = save_checkpoint_async(ckpt, tmp_path / "a.ckpt")
    w.add_(1)  # training goes on at once: the file holds the tensors as they were
    handle.wait()
    back = load_checkpoint(tmp_path / "a.ckpt")
    assert torch.equal(back["state_dict"]["w"], w - 1) and back["epoch"] == 3


def test_async_checkpoint_io_orders_saves_loads_and_removes(tmp_path):
    io_ = OwnAsyncCheckpointIO()
    path = tmp_path / "sub" / "c.ckpt"
    for i in range(3):
        io_.save_checkpoint({"w": torch.full((1 << 18,), float(i))}, path)
    # A load waits for the path's saves, and sees the last one.
    assert torch.equal(io_.load_checkpoint(path)["w"], torch.full((1 << 18,), 2.0))
    io_.save_checkpoint({"w": torch.ones(1 << 20)}, path)
    io_.remove_checkpoint(path)  # waits for the save: nothing comes back after it
    io_.teardown()
    assert not path.exists()
    assert leftovers(path.parent) == []


def test_async_checkpoint_io_raises_a_failed_save(tmp_path):
    io_ = OwnAsyncCheckpointIO()
    over_a_dir = tmp_path / "d.ckpt"
    over_a_dir.mkdir()
    io_.save_checkpoint({"w": torch.ones(4)}, over_a_dir)  # fails in the background
    with pytest.raises(FastensorError, match="d.ckpt"):
        io_.load_checkpoint(over_a_dir)  # waits for the path's save: its error
    io_.teardown()  # reported once
    io_.save_checkpoint({"w": torch.ones(4)}, over_a_dir)
    with pytest.raises(FastensorError, match="d.ckpt"):
        io_.teardown()  # waits for every save: the error
    io_.save_checkpoint({"w": torch.ones(4)}, tmp_path / "good.ckpt")
    io_.teardown()
    assert over_a_dir.is_dir() and list(over_a_dir.iterdir()) == []
    assert torch.equal(load_checkpoint(tmp_path / "good.ckpt")["w"], torch.ones(4))


# -- a real Trainer ---------------------------------------------------------------------


class Regressor(L.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, hidden),
            torch.nn.BatchNorm1d(hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": sched}


def loaders():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g)
    ds = TensorDataset(x, y)
    return DataLoader(ds, batch_size=16), DataLoader(ds, batch_size=32)


def trainer(root: Path, max_epochs: int, plugin, callbacks=()) -> L.Trainer:
    return L.Trainer(
        default_root_dir=root,
        max_epochs=max_epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        plugins=[plugin] if plugin is not None else None,
        callbacks=list(callbacks),
        enable_checkpointing=bool(callbacks),
    )


def fit_and_resume(root: Path, plugin_factory) -> tuple[dict, L.Trainer, Path]:
    """Fits 2 epochs with a checkpoint per epoch, then resumes from the first one for 2 more
    epochs; returns the first checkpoint's path, the resumed model's state and trainer."""
    train, val = loaders()
    L.seed_everything(0, verbose=False)
    model = Regressor()
    ckpt_cb = ModelCheckpoint(
        dirpath=root / "ckpt",
        filename="{epoch}",
        save_top_k=-1,
        monitor="val_loss",
        save_last=True,
    )
    t = trainer(root, 2, plugin_factory(), [ckpt_cb])
    t.fit(model, train, val)
    first = root / "ckpt" / "epoch=0.ckpt"
    assert first.exists() and (root / "ckpt" / "last.ckpt").exists()
    L.seed_everything(1, verbose=False)
    resumed = Regressor()
    t2 = trainer(root / "resume", 3, plugin_factory())
    t2.fit(resumed, train, val, ckpt_path=first)
    state = {
        "model": {k: v.clone() for k, v in resumed.state_dict().items()},
        "optimizer": t2.optimizers[0].state_dict(),
        "scheduler": t2.lr_scheduler_configs[0].scheduler.state_dict(),
        "epoch": t2.current_epoch,
        "global_step": t2.global_step,
    }
    return state, t2, first


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("default")
    return fit_and_resume(root, lambda: None)


PLUGINS = {
    "sync": CheckpointIO,
    "lightning-async": lambda: AsyncCheckpointIO(CheckpointIO()),
    "own-async": OwnAsyncCheckpointIO,
}


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_trainer_resume_equals_the_default_checkpoint_io(tmp_path, default_run, plugin):
    expected, _, default_first = default_run
    factory = PLUGINS[plugin]
    # (Lightning's AsyncCheckpointIO copies the checkpoint, dropping the state dict's
    # `_metadata`, whatever the CheckpointIO under it.)
    attrs = plugin != "lightning-async"

    state, t2, first = fit_and_resume(tmp_path, factory)
    # The files are fastensor's (safetensors), and hold what Lightning's default file holds.
    with safetensors.safe_open(str(first), framework="pt") as f:
        assert SKELETON in list(f.keys())
    ours = load_checkpoint(first, weights_only=False)
    theirs = torch.load(default_first, weights_only=False)
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "loops", "epoch"):
        assert_same(ours[key], theirs[key], key, attrs=attrs)
    assert ours["hyper_parameters"] == theirs["hyper_parameters"]
    assert ours["callbacks"].keys() == theirs["callbacks"].keys()
    # The run resumed from fastensor's checkpoint equals the one resumed from Lightning's.
    assert state["epoch"] == expected["epoch"] == 3
    assert state["global_step"] == expected["global_step"]
    assert_same(state["model"], expected["model"], "model")
    assert_same(state["optimizer"], expected["optimizer"], "optimizer")
    assert_same(state["scheduler"], expected["scheduler"], "scheduler")
    assert leftovers(tmp_path / "ckpt") == []
