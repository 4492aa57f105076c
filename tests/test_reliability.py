"""Resume, pre-emption, checkpoints that load anywhere, and clear errors for bad input."""

import logging
import os
import signal
import tempfile
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

import kindling.train
from kindling.checkpoints import read_checkpoint
from kindling.config.instantiate import instantiate_group
from kindling.errors import UserError
from kindling.loading import load_module
from kindling.models.cnn import CNNClassifier
from kindling.run.starting_checkpoint import with_checkpoint_overrides
from kindling.train import run

from helpers import (
    CONFIG_DIR,
    QUIET,
    copy_run,
    error_lines,
    folder_contents,
    in_folder,
    last_value,
    read_metrics,
    start_train_py,
    train_py_here,
)

REPRODUCIBLE = [
    "trainer=cpu", "trainer.deterministic=true", "seed=7", "test=false", "callbacks.plots=null",
    *QUIET,
]  # fmt: skip


@pytest.mark.slow
def test_resume_gives_the_same_numbers_as_a_straight_run(compose_config, tmp_path: Path) -> None:
    """4 epochs straight == 2 epochs, then resume to 4: same val/loss and the same weights."""
    # The schedule's length pinned to the 4 epochs (of 5 steps) of the straight run.
    common = [*REPRODUCIBLE, "debug=limit", "+model.scheduler.total_steps=20"]
    run(in_folder(compose_config(*common, "trainer.max_epochs=4"), tmp_path / "straight"))
    run(in_folder(compose_config(*common, "trainer.max_epochs=2"), tmp_path / "resumed"))
    checkpoint = tmp_path / "resumed" / "checkpoints" / "last.ckpt"
    run(
        in_folder(
            compose_config(*common, "trainer.max_epochs=4", f"ckpt_path={checkpoint}"),
            tmp_path / "resumed",
        )
    )
    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert last_value(resumed, "epoch") == last_value(straight, "epoch") == 3
    assert last_value(resumed, "val/loss") == pytest.approx(
        last_value(straight, "val/loss"), abs=1e-6
    )
    assert last_value(resumed, "val/acc_best") == last_value(straight, "val/acc_best")
    weights = [
        torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for name in ("straight", "resumed")
    ]
    for key, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][key], tensor, rtol=0, atol=1e-6, msg=key)


def eight_gpu_states() -> list[torch.Tensor]:
    """CUDA generator states as an 8-GPU machine saves them: a seed and an offset, in bytes."""
    return [torch.arange(16, dtype=torch.uint8) + gpu for gpu in range(8)]


def test_generators_of_eight_gpus_go_to_the_one_gpu_a_run_resumes_on(monkeypatch) -> None:
    from kindling.callbacks.resume import rng_states, set_rng_states

    states = {**rng_states(), "cuda": eight_gpu_states()}
    set_rng_states(states)  # a CPU: no GPU generator to set
    # A machine with one GPU, and its generator: each GPU is set at most once, this one only.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpus: dict[str, torch.Tensor] = {}

    def set_state(state: torch.Tensor, device: str | int = "cuda") -> None:
        gpus[str(device)] = state

    for module in (torch.cuda, torch.cuda.random):  # `set_rng_state_all` calls the latter's
        monkeypatch.setattr(module, "set_rng_state", set_state)
        monkeypatch.setattr(module, "get_rng_state", lambda device="cuda": gpus[str(device)])
    set_rng_states(states)
    assert list(gpus) == ["cuda"]  # the current device: this process's GPU
    assert torch.equal(gpus["cuda"], states["cuda"][0])
    assert [torch.equal(s, gpus["cuda"]) for s in rng_states()["cuda"]] == [True]


@pytest.mark.slow
def test_a_checkpoint_of_eight_gpus_resumes_on_a_cpu(compose_config, tmp_path: Path) -> None:
    common = [*REPRODUCIBLE, "debug=limit"]
    run(in_folder(compose_config(*common, "trainer.max_epochs=1"), tmp_path))
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)
    rng = saved["callbacks"]["ResumeExactly"]["rng"]
    assert rng["cuda"] == []  # what a CPU saves
    rng["cuda"] = eight_gpu_states()
    torch.save(saved, checkpoint)
    overrides = ["trainer.max_epochs=2", f"ckpt_path={checkpoint}"]
    run(in_folder(compose_config(*common, *overrides), tmp_path))
    assert last_value(read_metrics(tmp_path), "epoch") == 1


def test_test_only_run_reports_the_training_runs_test_accuracy(
    compose_config, tmp_path, trained_run
) -> None:
    trained = last_value(read_metrics(trained_run.run_dir), "test/acc")
    last = trained_run.last_checkpoint  # the weights the run ended with, which it tested
    cfg = compose_config("train=false", f"ckpt_path={last}", "trainer=cpu", *QUIET)
    run(in_folder(cfg, tmp_path / "tested"))
    assert last_value(read_metrics(tmp_path / "tested"), "test/acc") == pytest.approx(trained)


def test_checkpoints_load_with_weights_only_and_without_compile_prefixes(
    trained_run, tmp_path: Path
) -> None:
    path = trained_run.last_checkpoint
    checkpoint = torch.load(path, weights_only=True)  # raises on any non-plain object
    assert isinstance(checkpoint["config"], dict)
    module, _ = load_module(path)
    assert not module.training
    # The trained net wrapped by torch.compile, as a user's script or an older kindling compiled
    # it, and run once: its weights are saved as `net._orig_mod.<name>`. (The eager backend:
    # Dynamo traces the net for real; Inductor's code generation, ~30 s on a CPU, names nothing.)
    module.net = torch.compile(module.net, backend="eager")
    images = torch.randn(4, *checkpoint["config"]["model"]["net"]["image_shape"])
    with torch.no_grad():
        for weight in module.parameters():
            weight.mul_(1.5)  # not the trained run's weights: loading them must be seen
        expected = module(images)
    state_dict = module.state_dict()
    assert any(key.startswith("net._orig_mod.") for key in state_dict)
    compiled = tmp_path / "compiled.ckpt"
    torch.save(checkpoint | {"state_dict": state_dict}, compiled)

    loaded, _ = load_module(compiled)
    assert not any("_orig_mod" in key for key in loaded.state_dict())
    assert loaded.state_dict().keys() == checkpoint["state_dict"].keys()
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), expected)


def test_compiling_in_place_keeps_the_checkpoint_keys() -> None:
    net = CNNClassifier(image_shape=(1, 8, 8), num_classes=10)
    keys = set(net.state_dict())
    net.compile()  # what Classifier(compile=true) does; compilation itself is lazy
    assert set(net.state_dict()) == keys


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    # The IO the Trainer of every run uses (configs/trainer/default.yaml).
    io = instantiate(OmegaConf.load(CONFIG_DIR / "trainer" / "default.yaml").plugins[0])
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": torch.tensor(1)}, path)
    # Nothing goes through the temp folder: it may be small, or on another file system (where a
    # move is a copy that a kill can cut short).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-temp-folder"))
    io.save_checkpoint({"step": torch.tensor(2)}, path)
    assert torch.load(path, weights_only=True)["step"] == 2

    real_save = torch.save

    def killed_midway(obj, f, *args, **kwargs) -> None:
        real_save(obj, f, *args, **kwargs)
        f.truncate(8)  # half a checkpoint on disk...
        raise KeyboardInterrupt  # ...when a SIGKILL stops the write

    monkeypatch.setattr(torch, "save", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": torch.tensor(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_run_saves_a_checkpoint_and_resumes(
    compose_config, tmp_path: Path, caplog, sig, code
) -> None:
    # Epochs of 5 steps: the signal lands in a step, a validation or an epoch's end alike.
    args = ["trainer=cpu", "trainer.limit_train_batches=5", "trainer.limit_val_batches=2",
            "test=false", "callbacks.plots=null", *QUIET]  # fmt: skip
    process = start_train_py(
        *args, "trainer.max_epochs=200", "hydra.run.dir=run", cwd=tmp_path, ctrl_c=True
    )
    checkpoints = tmp_path / "run" / "checkpoints"
    # Generous: a loaded machine may take minutes to start and train one epoch; a signal sent
    # before training starts would only test Python's default handler.
    deadline = time.monotonic() + 600
    while not list(checkpoints.glob("epoch_*.ckpt")):
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            pytest.fail(f"no epoch checkpoint in 600 s:\n{process.communicate()[0][-3000:]}")
        time.sleep(0.2)
    process.send_signal(sig)
    output, _ = process.communicate(timeout=600)
    assert process.returncode == code, output[-3000:]
    assert f"Resume with: python train.py ckpt_path={checkpoints / 'last.ckpt'}" in output
    interrupted = torch.load(checkpoints / "last.ckpt", weights_only=True)
    # Saved at the interrupt, after the first epoch's checkpoint: at the end of a training step,
    # or at the end of an epoch when the signal came during its validation or its end.
    assert interrupted["global_step"] > 0 and 0 < interrupted["epoch"] < 199

    # Resumed in this process (run returning is exit status 0), in the interrupted run's folder
    # (compose_config's tmp_path/run): what the interrupt saved is the point here; resuming
    # `python train.py` from the line it printed is test_resume_alone's.
    epochs = f"trainer.max_epochs={interrupted['epoch'] + 2}"
    with caplog.at_level(logging.INFO):
        run(compose_config(*args, epochs, f"ckpt_path={checkpoints / 'last.ckpt'}"))
    assert "Restored all states" in caplog.text
    # The resumed run validated every epoch once, wherever the signal landed.
    validated = [int(r["epoch"]) for r in read_metrics(tmp_path / "run") if r["val/loss"]]
    assert validated == list(range(interrupted["epoch"] + 2))


BAD_INPUT = {
    "unknown model": (["model=resnet"], "Available options in 'model'"),
    "gpu without CUDA": (["trainer=gpu"], "CUDA is not available on this machine"),
    "cuda without CUDA": (["trainer.accelerator=cuda"], "Use trainer=cpu"),
    "too many devices": (["trainer.accelerator=cpu", "trainer.devices=512"], "512 CPU processes"),
    "missing checkpoint": (["ckpt_path=nowhere.ckpt"], "nowhere.ckpt does not exist"),
    "zero batch size": (["data.batch_size=0"], "must be a positive integer, got 0"),
    "negative batch size": (["data.batch_size=-8"], "must be a positive integer, got -8"),
    "batch over world size": (
        ["trainer.accelerator=cpu", "trainer.devices=2", "data.batch_size=63"],
        "must divide evenly over 2 processes",
    ),
    "non-numeric value": (
        ["model.optimizer.lr=fast"],
        "model.optimizer.lr=fast has the wrong type",
    ),
    "null number": (["data.batch_size=null"], "data.batch_size=null has the wrong type"),
    "data missing offline": (["data=mnist", "data.download=false"], "MNIST/raw"),
    "test without checkpoint": (["train=false"], "give it with ckpt_path=<file>"),
    "classifier on text": (
        ["experiment=charlm", "model=lstm"],
        "model=lstm is a classifier, and data=text/char has no classes. For a language model "
        "use model=lm/<family>",
    ),
}


@pytest.mark.parametrize("case", [c for c in BAD_INPUT if c != "unknown model"])
def test_bad_input_gives_a_short_clear_error(compose_config, caplog, tmp_path, case) -> None:
    """In-process: what `python train.py` runs once Hydra has composed the config."""
    args, message = BAD_INPUT[case]
    with pytest.raises(SystemExit) as stopped:
        run(compose_config(*args, *QUIET))
    assert stopped.value.code == 1
    (error,) = error_lines(caplog)  # one message, no traceback
    assert message in error
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained, nothing written


@pytest.mark.slow
def test_bad_input_on_the_command_line_is_one_line_without_traceback(tmp_path: Path) -> None:
    """The whole path once, through Hydra's own composition error."""
    args, message = BAD_INPUT["unknown model"]
    result = train_py_here(*args, "hydra.run.dir=run", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert message in output, output[-2000:]
    assert "Traceback" not in output
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_checkpoints_of_another_model_and_other_files_are_refused(
    compose_config, tmp_path: Path, trained_run, caplog, monkeypatch
) -> None:
    """In-process, from the overrides `train.py` makes of its command line (a checkpoint's own
    overrides come first when the command has none)."""
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    monkeypatch.chdir(tmp_path)  # where `python train.py` would run: notes.ckpt is relative
    cases = {
        f"model=lstm ckpt_path={trained_run.last_checkpoint}": "holds a CNNClassifier, but",
        "ckpt_path=notes.ckpt": "notes.ckpt is not a readable checkpoint",
    }
    for args, message in cases.items():
        caplog.clear()
        with pytest.raises(SystemExit) as stopped:
            run(compose_config(*with_checkpoint_overrides(args.split(), CONFIG_DIR)))
        (error,) = error_lines(caplog)  # one message, no traceback
        assert stopped.value.code != 0 and message in error, error


class SigtermDuringValidation(L.Callback):
    """Sends this process SIGTERM after the first batch of the second epoch's validation."""

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, *args) -> None:
        if trainer.current_epoch == 1 and batch_idx == 0 and not trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGTERM)


class SigtermBeforeValidation(L.Callback):
    """Sends this process SIGTERM in the second epoch's last step (debug=limit: 5 a epoch): the
    ranks agree to stop at its end, just before the epoch's validation."""

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if trainer.current_epoch == 1 and batch_idx == 4:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("signaller", [SigtermDuringValidation, SigtermBeforeValidation])
def test_sigterm_during_validation_stops_when_the_epoch_has_validated(
    compose_config, tmp_path: Path, monkeypatch, signaller
) -> None:
    # Lightning alone stops in the middle of the validation; resumed from there, the run never
    # validated that epoch.
    cfg = compose_config("trainer=cpu", "debug=limit", "test=false", *QUIET)
    monkeypatch.setattr(
        kindling.train, "instantiate_group",
        lambda config, group: [*instantiate_group(config, group), signaller()]
        if group == "callbacks" else instantiate_group(config, group),
    )  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        run(cfg)
    assert stopped.value.code == 128 + signal.SIGTERM
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 2  # epoch 1 done, validated
    monkeypatch.undo()
    run(compose_config("trainer=cpu", "debug=limit", "test=false", f"ckpt_path={checkpoint}"))
    validated = [int(r["epoch"]) for r in read_metrics(tmp_path / "run") if r["val/loss"]]
    assert validated == [0, 1, 2]


def test_last_checkpoint_is_the_last_epoch_when_the_best_is_older(
    compose_config, tmp_path: Path
) -> None:
    # A learning rate of 0 and a net without batch norm (whose running statistics would move
    # without the weights): val/loss never improves on epoch 0, so the best checkpoint stays at
    # epoch 0 while last.ckpt must follow every epoch.
    cfg = compose_config(
        *REPRODUCIBLE, "trainer.max_epochs=3", "debug=limit", "model=transformer",
        "model.optimizer.lr=0", "model.scheduler=null",
    )  # fmt: skip
    run(cfg)
    checkpoints = Path(cfg.paths.output_dir) / "checkpoints"
    last = torch.load(checkpoints / "last.ckpt", weights_only=True)
    # Saved at the third epoch's end: its training processed, as a resume reads it.
    assert last["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"] == 3
    assert sorted(path.name for path in checkpoints.glob("*.ckpt")) == [
        "epoch_000.ckpt",
        "last.ckpt",
    ]


def damage(checkpoint: Path, how: str) -> None:
    """Cut `checkpoint` to nothing, or to half its bytes (a copy that stopped, a full disk)."""
    data = checkpoint.read_bytes()
    checkpoint.write_bytes(b"" if how == "empty" else data[: len(data) // 2])


DAMAGE = {"empty": "is empty (0 bytes)", "truncated": "is not a readable checkpoint"}


@pytest.mark.parametrize(("how", "named"), DAMAGE.items())
def test_a_damaged_checkpoint_is_named_with_the_intact_ones_beside_it(
    trained_run, tmp_path: Path, how: str, named: str
) -> None:
    checkpoints = copy_run(trained_run, tmp_path / "run") / "checkpoints"
    best = trained_run.best_checkpoint.name
    older = checkpoints / "epoch_000.ckpt"  # a second intact one, saved before the best
    older.write_bytes((checkpoints / best).read_bytes())
    # Older than the best, however long ago the shared run was trained (copies keep its times).
    saved = (checkpoints / best).stat().st_mtime - 60
    os.utime(older, (saved, saved))
    (checkpoints / "broken.ckpt").write_bytes(b"")  # damaged too: not offered
    damage(checkpoints / "last.ckpt", how)
    with pytest.raises(UserError) as refused:
        read_checkpoint(checkpoints / "last.ckpt")
    message = str(refused.value)
    assert f"{checkpoints / 'last.ckpt'} {named}" in message
    assert f"Intact checkpoints beside it, newest first: {best}, epoch_000.ckpt" in message
    assert f"ckpt_path={checkpoints}/<name>" in message
    assert "\n" not in message


@pytest.mark.slow
def test_a_refused_resume_leaves_the_run_folder_as_it_was(trained_run, tmp_path: Path) -> None:
    """`ckpt_path=last` of a run whose last.ckpt is empty: one line, and the run's folder
    holds what it held (no `.hydra/resumed_*` of the refused attempt)."""
    run_dir = copy_run(trained_run, tmp_path / "logs" / "train" / "runs" / "first")
    damage(run_dir / "checkpoints" / "last.ckpt", "empty")
    # Hydra opens the run's train.log before kindling runs: the refusal's line is added there;
    # .lock names the last process that held the folder, the refused one.
    changed = ("train.log", ".lock")
    before = folder_contents(run_dir, but=changed)
    result = train_py_here("trainer=cpu", "ckpt_path=last", *QUIET, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "last.ckpt is empty (0 bytes)" in output, output[-2000:]
    assert trained_run.best_checkpoint.name in output
    assert "Traceback" not in output
    assert folder_contents(run_dir, but=changed) == before
