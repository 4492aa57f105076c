"""The GPU fast-path switches change speed, not results: checked on the CPU where they can be."""

import functools
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.strategies import SingleDeviceStrategy
from omegaconf import open_dict
from torch.overrides import TorchFunctionMode

from kindling.callbacks.divergence import StopOnDivergence
from kindling.data.text import Vocabulary
from kindling.models import TransformerLanguageModel
from kindling.modules import LanguageModel
from kindling.train import run

BASE = [
    "trainer=cpu",
    "debug=limit",
    "test=false",
    "seed=3",
    "model.net.dropout=0.0",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
]


def train_losses(compose_config, folder: Path, *overrides: str) -> list[float]:
    import csv

    cfg = compose_config(*BASE, *overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(folder)
    run(cfg)
    with open(folder / "csv" / "metrics.csv") as f:
        return [float(r["train/loss"]) for r in csv.DictReader(f) if r["train/loss"]]


def test_channels_last_gives_the_same_loss_curve(compose_config, tmp_path: Path) -> None:
    plain = train_losses(compose_config, tmp_path / "plain")
    nhwc = train_losses(compose_config, tmp_path / "nhwc", "model.channels_last=true")
    assert len(plain) == len(nhwc) == 3
    # Same math; other kernels sum in another order, so the last bits differ.
    assert nhwc == pytest.approx(plain, rel=2e-3)


def test_bf16_mixed_precision_follows_the_float32_curve(compose_config, tmp_path: Path) -> None:
    fp32 = train_losses(compose_config, tmp_path / "fp32")
    bf16 = train_losses(compose_config, tmp_path / "bf16", "trainer.precision=bf16-mixed")
    # bf16 keeps 8 bits of mantissa: close, not equal.
    assert bf16 == pytest.approx(fp32, rel=0.05)
    assert bf16[-1] < bf16[0]


def test_channels_last_module_stores_nhwc_weights(compose_config) -> None:
    module = instantiate(compose_config("model.channels_last=true").model, _convert_="all")
    module.setup("fit")
    conv = next(m for m in module.net.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)


class HostReads(TorchFunctionMode):
    """Records the calls that wait for the device on a GPU: handing a value to Python, or an
    output whose size depends on the values."""

    READS = {"__bool__", "item", "tolist", "cpu", "numpy", "__int__", "__float__", "__index__"}
    READS |= {"unique", "_unique2", "unique_consecutive", "nonzero", "argwhere", "masked_select"}

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("model", ["cnn", "rnn", "lstm", "transformer"])
def test_classifier_steps_never_read_a_value_on_the_host(compose_config, model: str) -> None:
    module = instantiate(compose_config(f"model={model}").model, _convert_="all")
    batch = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    divergence = StopOnDivergence(check_every_n_steps=50)
    with HostReads() as host:
        loss = module.training_step(batch, 0)
        loss.backward()
        divergence.on_train_batch_end(SimpleNamespace(global_step=7), module, loss, batch, 0)
        with torch.no_grad():
            module.validation_step(batch, 0)
            module.test_step(batch, 0)
    assert host.reads == []
    # The probe itself works: the epoch-end computation does read the metrics.
    with HostReads() as host:
        module.train_acc.compute()
        divergence._raise_if_diverged(
            SimpleNamespace(global_step=50, strategy=SingleDeviceStrategy(torch.device("cpu")))
        )
    assert host.reads


def test_language_model_steps_never_read_a_value_on_the_host() -> None:
    net = functools.partial(
        TransformerLanguageModel, context_length=16, d_model=32, num_layers=2, num_heads=4
    )
    module = LanguageModel(net=net, optimizer=functools.partial(torch.optim.AdamW, lr=0.01))
    module.build(Vocabulary.from_text("abcdefgh"))
    batch = torch.randint(0, 8, (4, 16)), torch.randint(0, 8, (4, 16))
    with HostReads() as host:
        module.training_step(batch, 0).backward()
        with torch.no_grad():
            module.validation_step(batch, 0)
    assert host.reads == []


def test_mnist_fast_uses_every_switch(compose_config) -> None:
    cfg = compose_config("experiment=mnist_fast")
    assert cfg.data.on_device and cfg.model.compile and cfg.model.channels_last
    assert cfg.trainer.precision == "bf16-mixed" and cfg.trainer.benchmark
    assert cfg.float32_matmul_precision == "high"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fast_path_on_the_gpu(compose_config, tmp_path: Path) -> None:
    losses = train_losses(
        compose_config, tmp_path / "gpu", "trainer=gpu", "data.on_device=true",
        "model.channels_last=true", "model.compile=true", "trainer.precision=bf16-mixed",
    )  # fmt: skip
    assert losses[-1] < losses[0]
