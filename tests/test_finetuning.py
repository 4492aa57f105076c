"""timm backbones by config, locally stored pretrained weights, fine-tuning and weight EMA."""

import csv
import functools
from pathlib import Path

import lightning as L
import pytest
import timm
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from kindling.callbacks.ema import EMAWeights
from kindling.config.instantiate import instantiate_group
from kindling.errors import UserError
from kindling.loading import load_module
from kindling.models.cnn import CNNClassifier
from kindling.models.timm_net import TimmClassifier
from kindling.modules.classifier import Classifier
from kindling.train import run

from helpers import QUIET, make_folder, quiet_trainer

TINY = "test_resnet"  # one of timm's models for tests: 0.4 M parameters


def test_an_unknown_timm_name_is_one_line_with_close_matches() -> None:
    with pytest.raises(UserError, match=r"resnet18x is not a timm model\. Close matches: resnet18"):
        TimmClassifier("resnet18x", image_shape=[3, 16, 16], num_classes=2)


def test_a_locally_stored_pretrained_backbone_loads_its_weights(tmp_path: Path) -> None:
    # "Pretrained" on a 7-class task; the new task has 3 classes.
    source = timm.create_model(TINY, num_classes=7, in_chans=1)
    torch.nn.init.normal_(source.conv1[0].weight)  # weights no fresh model starts from
    file = tmp_path / "backbone.pth"
    torch.save(source.state_dict(), file)

    net = TimmClassifier(TINY, [1, 16, 16], num_classes=3, pretrained_file=str(file))
    loaded = net.model.state_dict()
    backbone = [k for k in source.state_dict() if not k.startswith("fc.")]
    assert all(torch.equal(loaded[k], source.state_dict()[k]) for k in backbone)
    assert loaded["fc.weight"].shape == (3, net.head.in_features)  # a new head, for 3 classes
    assert net(torch.zeros(2, 1, 16, 16)).shape == (2, 3)

    fresh = TimmClassifier(TINY, [1, 16, 16], num_classes=3)
    assert not torch.equal(fresh.model.conv1[0].weight, source.conv1[0].weight)
    with pytest.raises(UserError, match=r"pretrained_file=nowhere\.pth is not a file"):
        TimmClassifier(TINY, [1, 16, 16], num_classes=3, pretrained_file="nowhere.pth")


def test_image_folder_size_and_statistics_follow_a_pretrained_net(
    compose_config, tmp_path: Path
) -> None:
    root = make_folder(tmp_path / "images", per_class=1)
    folder = ["data=image_folder", f"data.path={root}", "model=timm", "model.net.name=test_vit"]
    pretrained = compose_config(*folder, "model.net.pretrained=true").data
    assert (pretrained.image_size, pretrained.mean, pretrained.std) == (160, [0.5] * 3, [0.5] * 3)
    scratch = compose_config(*folder).data  # no pretrained weights: the folder's own defaults
    assert (scratch.image_size, scratch.mean, scratch.std) == (64, None, None)
    given = compose_config(*folder, "model.net.pretrained=true", "data.image_size=32").data
    assert given.image_size == 32  # the data config says otherwise
    assert compose_config(*folder[:2], "model=cnn").data.image_size == 64
    grey = compose_config(*folder, "model.net.pretrained=true", "data.channels=1").data
    assert (grey.mean, grey.std) == ([0.5], [0.5])  # one channel: the mean of the three


def test_the_ema_option_adds_the_average_to_the_default_callbacks(compose_config) -> None:
    cfg = compose_config("callbacks=[default,ema]", "callbacks.ema.decay=0.99")
    callbacks = instantiate_group(cfg.callbacks, "callbacks")
    (ema,) = [c for c in callbacks if isinstance(c, EMAWeights)]
    assert (ema.update_every_n_steps, ema.update_starting_at_step) == (1, None)
    assert len(callbacks) == len(instantiate_group(compose_config().callbacks, "callbacks")) + 1


def test_an_image_folder_trains_a_timm_backbone_from_config(compose_config, tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=8)
    weights = tmp_path / "pretrained.pth"
    torch.save(timm.create_model(TINY).state_dict(), weights)
    cfg = compose_config(
        "data=image_folder", f"data.path={root}", "data.image_size=16", "data.batch_size=8",
        "data.num_workers=0", "model=timm", f"model.net.name={TINY}", "trainer=cpu",
        f"model.net.pretrained_file={weights}", "data.mean=[0.5,0.5,0.5]",
        "data.std=[0.5,0.5,0.5]", "trainer.max_epochs=1", "model.backbone_lr_ratio=0.25", *QUIET,
    )  # fmt: skip
    run(cfg)
    with open(Path(cfg.paths.output_dir) / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("lr-AdamW/head")]
    assert rows and all(
        float(r["lr-AdamW/backbone"]) == pytest.approx(0.25 * float(r["lr-AdamW/head"]))
        for r in rows
    )
    assert any(float(r["lr-AdamW/head"]) > 0 for r in rows)
    # The checkpoint is all a deployment needs: not the file (nor the hub) training started from.
    weights.unlink()
    checkpoint = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    module, saved = load_module(checkpoint)
    assert isinstance(module.net, TimmClassifier)
    assert saved["config"]["model"]["net"]["pretrained_file"] == str(weights)
    assert all(torch.equal(v, saved["state_dict"][k]) for k, v in module.state_dict().items())


# Fine-tuning mechanics on a plain Trainer: 8x8 random images, 3 classes.


def tiny_loader(count: int = 32) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(count, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 3, (count,), generator=generator)
    return DataLoader(TensorDataset(images, labels), batch_size=8)


def classifier(net: torch.nn.Module, **kwargs) -> Classifier:
    sgd = functools.partial(torch.optim.AdamW, lr=0.01)
    return Classifier(net, num_classes=3, optimizer=sgd, **kwargs)


def fit(module: Classifier, callbacks: list[Callback], epochs: int = 2, **trainer) -> L.Trainer:
    trainer = quiet_trainer(max_epochs=epochs, callbacks=callbacks, **trainer)
    trainer.fit(module, tiny_loader(), tiny_loader(16))
    return trainer


class Snapshots(Callback):
    """The net's weights and batch-norm statistics at the end of each training epoch."""

    def __init__(self) -> None:
        self.states: list[dict[str, torch.Tensor]] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.states.append({k: v.clone() for k, v in pl_module.net.state_dict().items()})


def test_a_frozen_backbone_learns_only_after_its_epochs() -> None:
    net = TimmClassifier(TINY, [1, 8, 8], num_classes=3)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    snapshots = Snapshots()
    fit(classifier(net, freeze_backbone_epochs=1), [snapshots])
    first, second = snapshots.states
    backbone = [k for k in start if not k.startswith("model.fc.")]
    # Epoch 0: weights and batch-norm statistics of the backbone as they were; the head learnt.
    assert all(torch.equal(first[k], start[k]) for k in backbone)
    assert not torch.equal(first["model.fc.weight"], start["model.fc.weight"])
    # Epoch 1: the backbone learns too.
    assert not torch.equal(second["model.conv1.0.weight"], first["model.conv1.0.weight"])
    assert not torch.equal(second["model.bn1.running_mean"], first["model.bn1.running_mean"])


def test_backbone_learning_rate_is_a_share_of_the_head_s() -> None:
    module = classifier(TimmClassifier(TINY, [1, 8, 8], num_classes=3), backbone_lr_ratio=0.1)
    trainer = fit(module, [], epochs=1, max_steps=1)
    backbone, head = trainer.optimizers[0].param_groups
    assert (backbone["name"], head["name"]) == ("backbone", "head")
    assert backbone["lr"] == pytest.approx(0.001) and head["lr"] == pytest.approx(0.01)
    assert {id(p) for p in head["params"]} == {id(p) for p in module.net.head.parameters()}
    count = sum(len(g["params"]) for g in (backbone, head))
    assert count == len(list(module.net.parameters()))
    # kindling's own nets name their head too; a net without one is refused in one line.
    fit(classifier(CNNClassifier([1, 8, 8], 3), backbone_lr_ratio=0.5), [], epochs=1, max_steps=1)
    headless = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    with pytest.raises(UserError, match="has no `head` submodule"):
        fit(classifier(headless, backbone_lr_ratio=0.5), [], epochs=1, max_steps=1)


class SeenByValidation(Callback):
    """The last training step's weights, the weights validation runs on, and a checkpoint
    written after validation (as ModelCheckpoint writes them)."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self.trained = self.validated = None

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.trained = head_weight(pl_module).clone()

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self.validated = head_weight(pl_module).clone()

    def on_validation_end(self, trainer, pl_module) -> None:
        trainer.save_checkpoint(self.checkpoint)


def head_weight(module: L.LightningModule) -> torch.Tensor:
    return module.net.head[-1].weight.detach()


def test_ema_weights_are_validated_tested_checkpointed_and_kept(tmp_path: Path) -> None:
    ema = EMAWeights(decay=0.5)
    path = tmp_path / "ema.ckpt"
    seen = SeenByValidation(path)  # after the EMA callback: it swaps the average in first
    module = classifier(CNNClassifier([1, 8, 8], 3))
    trainer = fit(module, [ema, seen], epochs=1, num_sanity_val_steps=0)
    average = head_weight(ema._average_model.module)
    # Validation saw the average, not the last step's weights ...
    assert torch.equal(seen.validated, average)
    assert not torch.equal(seen.trained, average)
    # ... the checkpoint holds it as its weights (the step's weights to resume from beside) ...
    saved = torch.load(path, weights_only=True)
    assert torch.equal(saved["state_dict"]["net.head.2.weight"], average)
    assert torch.equal(saved["current_model_state"]["net.head.2.weight"], seen.trained)
    # ... and what loads a checkpoint (prediction, export) gets it, as does the module itself.
    assert torch.equal(head_weight(load_module_weights(path)), average)
    assert torch.equal(head_weight(module), average)
    # Testing that checkpoint after fit (what train.py does) tests the average too.
    with torch.no_grad():
        head_weight(module).zero_()
    trainer.test(module, tiny_loader(16), ckpt_path=str(path), verbose=False)
    assert torch.equal(head_weight(module), average)


def load_module_weights(path: Path) -> Classifier:
    module = classifier(CNNClassifier([1, 8, 8], 3))
    module.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    return module
