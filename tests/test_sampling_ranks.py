"""Text samples during validation with several processes: every rank runs the generation (under
FSDP each forward pass gathers weights from all ranks), one copy is printed and saved."""

import functools
import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kindling.data.text import Vocabulary
from kindling.models.blocks import TransformerBlock
from kindling.models.language_models import TransformerLanguageModel
from kindling.modules.language_model import SAMPLES_FILE, LanguageModel

from helpers import TESTS, TINY_CORPUS, free_port, tiny_experiment, train_py


def tiny_language_model() -> LanguageModel:
    torch.manual_seed(0)
    net = functools.partial(
        TransformerLanguageModel, context_length=16, d_model=32, num_layers=2, num_heads=2
    )
    module = LanguageModel(net=net, optimizer=functools.partial(torch.optim.AdamW, lr=0.01))
    module.build(Vocabulary(TINY_CORPUS))
    return module


def sample_under_fsdp(rank: int, port: int, folder: Path) -> None:
    """One of 2 gloo processes: shard the model with FSDP, train a step, validate, sample."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    module = tiny_language_model()
    sharded = FullyShardedDataParallel(
        module, auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}),
        device_id=torch.device("cpu"), use_orig_params=True,
    )  # fmt: skip
    tokens = torch.randint(0, 10, (2, 16))
    sharded(tokens).sum().backward()  # a training step leaves every weight sharded
    with torch.no_grad():
        sharded.eval()(tokens)  # a validation step
    with FullyShardedDataParallel.summon_full_params(sharded, writeback=False):
        text = module.sample("Flat", 30, seed=1)
    (folder / f"rank{rank}.txt").write_text(text)
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_samples_the_whole_model_under_fsdp(tmp_path: Path) -> None:
    # Forked from this process, which has imported all they need (spawned, each would import
    # torch and kindling again: seconds each).
    mp.start_processes(
        sample_under_fsdp, args=(free_port(), tmp_path), nprocs=2, start_method="fork"
    )
    unsharded = tiny_language_model().sample("Flat", 30, seed=1)
    assert (tmp_path / "rank0.txt").read_text() == unsharded
    assert (tmp_path / "rank1.txt").read_text() == unsharded


@pytest.mark.slow
def test_with_two_processes_every_rank_generates_and_one_prints(
    tmp_path: Path, monkeypatch
) -> None:
    corpus = tmp_path / "tiny.txt"
    corpus.write_text(TINY_CORPUS, encoding="utf-8")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    )
    result = train_py(
        *tiny_experiment("transformer", corpus), "trainer.accelerator=cpu", "trainer.devices=2",
        "trainer.max_epochs=1", "trainer.limit_val_batches=2", "test=false",
        "+callbacks.count._target_=record_samples.CountGenerateCalls",
        cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    (run_dir,) = (tmp_path / "logs" / "charlm" / "runs").iterdir()
    validations = 2  # the sanity check and one epoch
    for rank in (0, 1):
        assert json.loads((run_dir / f"generate_rank{rank}.json").read_text()) == validations
    assert output.count("Sample at step") == validations
    assert (run_dir / SAMPLES_FILE).read_text().count("=== Sample") == validations
