"""A checkpoint alone resumes its run as it was configured; `ckpt_path=last` finds a run of this
command's configuration; a checkpoint that does not fit the model is refused in one line."""

import csv
import logging
import shlex
import shutil
import signal
from pathlib import Path

import pytest
import yaml
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict

import kindling.train

from helpers import (
    COLOURS,
    QUIET,
    compose_in,
    error_lines,
    folder_contents,
    in_folder,
    made_once,
    make_folder,
    pattern_rows,
    read_metrics,
    train_py_here,
    write_image,
    write_table,
)

# Short epochs, no pictures; the net's shapes differ from the default's (channels [32, 64]).
SMALL = [
    "trainer=cpu", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2",
    "callbacks.plots=null", *QUIET,
]  # fmt: skip
# What a refused resume may write into the folder it refused.
UNCOMPARED = ("train.log", ".lock")
NARROW = [*SMALL, "model.net.channels=[8,16]", "test=false"]

STOP_ONCE = '''
import os, signal
from pathlib import Path
import lightning as L


class StopOnce(L.Callback):
    """SIGTERM to this process at the second epoch's first step, once: what a cluster sends."""

    def __init__(self, marker: str):
        self.marker = Path(marker)

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.current_epoch == 1 and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), signal.SIGTERM)
'''


def train_two_runs(folder: Path) -> None:
    runs = folder / "logs" / "train" / "runs"
    for name, overrides in (("narrow", NARROW), ("default", [*SMALL, "test=false"])):
        cfg = compose_in(folder, *overrides, "trainer.max_epochs=1")
        with open_dict(cfg):
            cfg.paths.output_dir = str(runs / name)
        kindling.train.run(cfg)
        (runs / name / ".hydra").mkdir()  # what train.py leaves: a resume continues there
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs of one epoch under `<folder>/logs/train/runs`, trained in-process once per
    session: `narrow` (NARROW's overrides), then `default` (SMALL's), the newer."""
    folder, _ = made_once(tmp_path_factory, "resume_alone_two_runs", train_two_runs)
    runs = folder / "logs" / "train" / "runs"
    return runs / "narrow", runs / "default"


def copy_runs(runs: tuple[Path, Path], cwd: Path) -> tuple[Path, ...]:
    """The runs under `cwd/logs/train/runs`, where `python train.py` in `cwd` looks."""
    for run in runs:
        shutil.copytree(run, cwd / "logs" / "train" / "runs" / run.name)
    return tuple(cwd / "logs" / "train" / "runs" / run.name for run in runs)


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_the_line_it_printed(
    compose_config, tmp_path: Path, caplog, monkeypatch
) -> None:
    (tmp_path / "stop_once.py").write_text(STOP_ONCE)
    monkeypatch.syspath_prepend(tmp_path)  # this process imports it too
    stop = ["+callbacks.stop._target_=stop_once.StopOnce", f"+callbacks.stop.marker={tmp_path}/x"]
    # The interrupted run in this process, in a run folder as `python train.py` leaves one; the
    # command it prints is run as a user runs it.
    first = compose_config(*NARROW, "trainer.max_epochs=3", *stop)
    (first_dir := tmp_path / "logs" / "train" / "runs" / "first").mkdir(parents=True)
    (first_dir / ".hydra").mkdir()
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as stopped:
        kindling.train.run(in_folder(first, first_dir))
    assert stopped.value.code == 128 + signal.SIGTERM
    printed = {line for message in caplog.messages for line in message.splitlines()}
    (line,) = [line for line in printed if line.startswith("Resume with: ")]
    python, script, *args = shlex.split(line.removeprefix("Resume with: "))
    assert (python, script) == ("python", "train.py")

    resumed = train_py_here(*args, cwd=tmp_path, module_dir=tmp_path)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    assert "Restored all states" in output
    assert "exists and is not empty" not in output  # Lightning's warning: the folder is its own
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()  # continued in its folder
    (record,) = (run_dir / ".hydra").glob("resumed_*/config.yaml")
    config = yaml.safe_load(record.read_text())
    assert config["model"]["net"]["channels"] == [8, 16]
    assert config["trainer"]["max_epochs"] == 3
    with open(run_dir / "csv" / "metrics.csv") as f:  # trained to its end, in its folder
        assert [row["epoch"] for row in csv.DictReader(f) if row["val/loss"]] == ["0", "1", "2"]


@pytest.mark.slow
def test_ckpt_path_last_refuses_a_finished_run_as_its_file_does(two_runs, tmp_path: Path) -> None:
    """`last` brings the length its run was trained to, as `ckpt_path=<file>` does: a finished
    run is not trained further under the default length."""
    narrow, _ = copy_runs(two_runs, tmp_path)
    before = folder_contents(narrow, but=UNCOMPARED)
    last = narrow / "checkpoints" / "last.ckpt"
    # `last` of this configuration (not the newest run's), the file alone, the file with the
    # configuration it was trained with.
    for args in (
        ["ckpt_path=last", *NARROW],
        [f"ckpt_path={last}"],
        [f"ckpt_path={last}", *NARROW],
    ):
        result = train_py_here(*args, cwd=tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == 1, output[-3000:]
        (line,) = [line for line in output.splitlines() if "has finished training" in line]
        assert "narrow/checkpoints/last.ckpt has finished training" in line, line
        assert "trainer.max_epochs=1" in line and "trainer.max_epochs=2" in line
    assert folder_contents(narrow, but=UNCOMPARED) == before


@pytest.mark.slow
def test_ckpt_path_last_takes_the_run_of_this_commands_overrides(
    two_runs, compose_config, tmp_path: Path, caplog, monkeypatch
) -> None:
    narrow, default = copy_runs(two_runs, tmp_path)
    # The newest run is `default`; these overrides are `narrow`'s (a longer run may resume it).
    result = train_py_here("ckpt_path=last", *NARROW, "trainer.max_epochs=2", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert f"Run folder: {narrow}" in output
    assert (narrow / "checkpoints" / "epoch_001.ckpt").is_file()
    assert not (default / "checkpoints" / "epoch_001.ckpt").exists()

    # Refused in this process, as `python train.py ckpt_path=last trainer=cpu` in tmp_path
    # composes it: which run the command line resumes was the point above.
    before = folder_contents(tmp_path / "logs" / "train" / "runs", but=())
    monkeypatch.chdir(tmp_path)
    cfg = compose_config("ckpt_path=last", "trainer=cpu", *QUIET)
    with open_dict(cfg):
        cfg.paths.log_dir = "logs"  # the default, relative to where train.py runs
    with pytest.raises(SystemExit) as refused:
        kindling.train.run(cfg)
    assert refused.value.code == 1
    (error,) = error_lines(caplog)  # one line, no traceback
    assert error.startswith("ckpt_path=last")
    assert "no run under logs/train/runs has this command's overrides" in error
    assert error.index(f"{Path('logs/train/runs/narrow')} (trainer=cpu") < error.index(
        f"{Path('logs/train/runs/default')} (trainer=cpu"
    )  # newest first: narrow was resumed last
    assert "model.net.channels=[8,16]" in error
    assert "ckpt_path=<run>/checkpoints/last.ckpt" in error
    runs = folder_contents(tmp_path / "logs" / "train" / "runs", but=())
    assert {k: v for k, v in runs.items() if k in before} == before


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_the_model_is_refused_in_one_line(
    two_runs, tmp_path: Path
) -> None:
    narrow, _ = copy_runs(two_runs, tmp_path)
    before = folder_contents(narrow, but=UNCOMPARED)
    checkpoint = narrow / "checkpoints" / "last.ckpt"
    result = train_py_here(
        f"ckpt_path={checkpoint}", "model.net.channels=[16,32]", "trainer.max_epochs=2",
        cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    (error,) = [line for line in output.splitlines() if "does not fit" in line]
    assert (
        f"{checkpoint} does not fit this config's model: model.net.features.0.0.weight: "
        "checkpoint [8, 1, 3, 3], this config [16, 1, 3, 3]. Its run had "
    ) in error
    assert "model.net.channels=[8,16]" in error
    assert "Traceback" not in output and "size mismatch" not in output
    # No .hydra/resumed_*, no csv/hparams_resumed_*.
    assert folder_contents(narrow, but=UNCOMPARED) == before


@pytest.mark.slow
def test_a_resume_on_changed_data_is_refused_in_one_line(
    compose_config, tmp_path: Path, caplog
) -> None:
    """Rows removed, rows added, a label changed: each refused, naming the split that changed;
    the data it trained on resumes."""
    rows = pattern_rows(120, seed=0)
    table = tmp_path / "table.csv"
    common = [
        "data=sequences", f"data.path={table}", "data.batch_size=16", "model=temporal_conv",
        "trainer=cpu", "test=false", "callbacks.plots=null", *QUIET,
    ]  # fmt: skip
    write_table(rows, table)
    first = compose_config(*common, "trainer.max_epochs=1")
    kindling.train.run(first)
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    ids = sorted({row["id"] for row in rows})
    relabelled = next(row for row in rows if row["id"] == ids[0])["label"]
    changed = {
        "rows removed": [row for row in rows if row["id"] not in ids[:40]],
        "rows added": rows
        + [{**row, "id": f"new{row['id']}"} for row in rows if row["id"] in ids[:9]],
        "a label changed": [
            {**row, "label": "flat" if relabelled != "flat" else "up"}
            if row["id"] == ids[0]
            else row
            for row in rows
        ],
    }
    for case, changed_rows in changed.items():
        write_table(changed_rows, table)
        caplog.clear()
        with pytest.raises(SystemExit):
            kindling.train.run(compose_config(*common, "trainer.max_epochs=2", f"ckpt_path={last}"))
        (line,) = error_lines(caplog)
        assert line.startswith(f"{last} was trained on other data: its "), (case, line)
        assert "split" in line and "Train a new run on this data" in line, (case, line)
    write_table(rows, table)
    assert (
        kindling.train.run(compose_config(*common, "trainer.max_epochs=2", f"ckpt_path={last}"))
        is not None
    )


@pytest.mark.slow
def test_a_resume_after_an_image_was_replaced_is_refused(
    compose_config, tmp_path: Path, caplog
) -> None:
    root = make_folder(tmp_path / "images", per_class=8)
    common = [
        "data=image_folder", f"data.path={root}", "data.image_size=8", "data.batch_size=8",
        "data.num_workers=0", "trainer=cpu", "test=false", "callbacks.plots=null", *QUIET,
    ]  # fmt: skip
    first = compose_config(*common, "trainer.max_epochs=1")
    kindling.train.run(first)
    last = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    write_image(root / "red" / "3.png", COLOURS["blue"], size=(14, 9), seed=3)  # a blue one
    with pytest.raises(SystemExit):
        kindling.train.run(compose_config(*common, "trainer.max_epochs=2", f"ckpt_path={last}"))
    (line,) = error_lines(caplog)
    assert line.startswith(f"{last} was trained on other data: its "), line
    assert "holds other samples (as many, " in line, line


def test_a_new_run_from_a_checkpoints_weights_starts_where_that_run_ended(
    trained_run, compose_config, caplog, tmp_path: Path
) -> None:
    """`weights_from=`: the way on where a resume is refused (other data): a new run, epoch 0,
    with the trained weights. One training batch from scratch is far from 0.9 on the digits."""
    weights = f"weights_from={trained_run.last_checkpoint}"
    kindling.train.run(compose_config("trainer.max_epochs=1", "trainer.limit_train_batches=1",
                                      "test=false", weights, *QUIET))  # fmt: skip
    rows = [row for row in read_metrics(tmp_path / "run") if row.get("val/acc")]
    assert [int(row["epoch"]) for row in rows] == [0]
    assert float(rows[0]["val/acc"]) >= 0.9, rows
    caplog.clear()
    with pytest.raises(SystemExit):  # one or the other: a resume has its own weights
        kindling.train.run(compose_config(weights, f"ckpt_path={trained_run.last_checkpoint}"))
    (line,) = error_lines(caplog)
    assert line.startswith("weights_from starts a new training run"), line
