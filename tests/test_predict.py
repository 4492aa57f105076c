"""Predicting from a checkpoint alone: a folder of image files, a table of sequences, or a data
set split, to CSV."""

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from sklearn.datasets import load_digits
from torchvision.io import write_png

from kindling import predict as predict_command
from kindling import sample as sample_command
from kindling.errors import UserError
from kindling.loading import data_state, load_module
from kindling.predict import PredictArgs, predict
from kindling.train import run

from forked import run_forked
from helpers import (
    QUIET,
    compose_in,
    error_lines,
    made_once,
    pattern_rows,
    read_csv,
    write_table,
)


@pytest.fixture
def checkpoint(trained_run) -> Path:
    return trained_run.last_checkpoint


def digit_files(folder: Path) -> list[int]:
    """The first 40 digits as 16x16 PNG files (prediction resizes them to the model's 8x8), half
    of them in a subfolder, and a file that is not an image; returns their labels."""
    digits = load_digits()
    (folder / "nested").mkdir(parents=True)
    for i in range(40):
        pixels = torch.tensor(digits.images[i] * 255 / 16).round().to(torch.uint8)[None]
        big = pixels.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)
        write_png(big, str(folder / ("nested" if i % 2 else "") / f"digit_{i:02d}.png"))
    (folder / "notes.txt").write_text("not an image")
    return list(digits.target[:40])


def predicted_right(checkpoint: Path, tmp_path: Path, accelerator: str = "auto") -> int:
    """How many of `digit_files` the checkpoint classifies right."""
    labels = digit_files(tmp_path / "images")
    output = predict(PredictArgs(str(checkpoint), str(tmp_path / "images"),
                                 str(tmp_path / "p.csv"), accelerator=accelerator))  # fmt: skip
    rows = read_csv(output)
    assert len(rows) == 40
    assert all(0.0 <= float(r["probability"]) <= 1.0 for r in rows)
    by_name = {Path(r["file"]).name: int(r["class"]) for r in rows}
    return sum(by_name[f"digit_{i:02d}.png"] == label for i, label in enumerate(labels))


def test_predicts_a_folder_of_image_files(checkpoint: Path, tmp_path: Path) -> None:
    # The model learnt the digits: its predictions on the files match the labels.
    assert predicted_right(checkpoint, tmp_path) >= 34


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_checkpoint_predicts_on_the_gpu(gpu_trained_run, tmp_path: Path) -> None:
    assert predicted_right(gpu_trained_run.last_checkpoint, tmp_path, accelerator="gpu") >= 34


def test_a_corrupt_file_is_named_and_the_others_predicted(
    checkpoint: Path, tmp_path: Path, caplog
) -> None:
    digits = load_digits()
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(5):
        pixels = torch.tensor(digits.images[i] * 255 / 16).round().to(torch.uint8)[None]
        write_png(pixels, str(folder / f"digit_{i}.png"))
    # A PNG signature and nothing readable after it: libpng fails inside decode_png.
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(40)))
    (folder / "notes.txt").write_text("not an image")

    with caplog.at_level(logging.WARNING):
        output = predict(
            PredictArgs(str(checkpoint), str(folder), str(tmp_path / "p.csv"), num_workers=0)
        )
    rows = read_csv(output)
    assert [Path(r["file"]).name for r in rows] == [f"digit_{i}.png" for i in range(5)]
    assert f"Skipped {folder / 'corrupt.png'}" in caplog.text
    assert "1 of 6 files could not be decoded" in caplog.text


def test_predictions_go_to_the_checkpoints_run_folder_by_default(trained_run, tmp_path) -> None:
    """Not into the folder predict runs in: a clone stays clean."""
    run = tmp_path / "run"
    shutil.copytree(trained_run.run_dir / "checkpoints", run / "checkpoints")
    output = predict(PredictArgs(ckpt_path=str(run / "checkpoints" / "last.ckpt"), input="val"))
    assert output == run / "predictions.csv" and len(read_csv(output)) > 0
    assert [p.name for p in Path.cwd().glob("predictions.csv")] == []


def test_predicts_a_data_set_split(checkpoint: Path, tmp_path: Path) -> None:
    output = predict(
        PredictArgs(ckpt_path=str(checkpoint), input="test", output=str(tmp_path / "t.csv"))
    )
    rows = read_csv(output)
    assert len(rows) == 359  # the digits test split
    assert {int(r["class"]) for r in rows} <= set(range(10))


def test_command_line_errors_are_short(
    checkpoint: Path, tmp_path: Path, caplog, monkeypatch
) -> None:
    cases = {
        (f"ckpt_path={checkpoint}",): "Missing mandatory value: input",
        (f"ckpt_path={checkpoint}", "input=nowhere"): "input=nowhere is not a folder",
        ("ckpt_path=missing.ckpt", "input=test"): "missing.ckpt does not exist",
        (f"ckpt_path={checkpoint}", "input=test", "batch_size=many"): "batch_size",
        (f"ckpt_path={checkpoint}", "input=test", "devices=2"): "input=test is predicted on one",
        (f"ckpt_path={checkpoint}", "input=test", "devices=0"): "devices=0: give the number",
    }
    monkeypatch.chdir(tmp_path)
    for args, message in cases.items():
        caplog.clear()
        with pytest.raises(SystemExit) as stopped:
            predict_command.main(list(args))
        assert stopped.value.code == 1
        (line,) = error_lines(caplog)
        assert message in line, line
    # The whole command, once: the message alone on stderr, no traceback.
    result = run_forked("-m kindling.predict", [f"ckpt_path={checkpoint}", "input=nowhere"],
                        cwd=tmp_path, timeout=120)  # fmt: skip
    assert result.returncode == 1
    assert "input=nowhere is not a folder" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


class WritesAFile:
    """A pickle payload: unpickling it would truncate `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def tampered(checkpoint: Path, folder: Path, key: str, node: object) -> Path:
    """A copy of `checkpoint` whose stored config has `node` at `config.<key>`."""
    state = torch.load(checkpoint, weights_only=True)
    parent, _, name = f"config.{key}".rpartition(".")
    target = state
    for part in parent.split("."):
        target = target[part]
    target[name] = node
    path = folder / f"tampered_{key}.ckpt"
    torch.save(state, path)
    return path


# `builtins.open(victim, "w")`, and `os.remove(victim)` named through a module of a package
# the stored configs may build from (timm's), which imports `os`.
@pytest.mark.parametrize("target", ["builtins.open", "timm.models._builder.os.remove"])
@pytest.mark.parametrize("key", ["model.net", "model.optimizer", "data"])
def test_a_checkpoint_naming_a_target_outside_kindlings_configs_is_refused_before_the_call(
    checkpoint: Path, tmp_path: Path, caplog, monkeypatch, key: str, target: str
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("kept")
    args = [str(victim), "w"] if target == "builtins.open" else [str(victim)]
    bad = tampered(checkpoint, tmp_path, key, {"_target_": target, "_args_": args})
    monkeypatch.chdir(tmp_path)
    entrypoints = {
        "predict": lambda: predict_command.main([f"ckpt_path={bad}", "input=test"]),
        "sample": lambda: sample_command.main([f"ckpt_path={bad}"]),
        "load_module": lambda: load_module(bad),
    }
    for name, call in entrypoints.items():
        caplog.clear()
        with pytest.raises((SystemExit, UserError)) as refused:
            call()
        message = str(refused.value) if refused.type is UserError else caplog.text
        assert target in message and "refused" in message, (name, message)
        assert victim.read_text() == "kept", name


def test_a_pickled_payload_is_refused_without_running(tmp_path: Path, caplog) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("kept")
    bad = tmp_path / "payload.ckpt"
    torch.save({"state_dict": {}, "config": {"model": WritesAFile(victim)}}, bad)
    with pytest.raises(SystemExit):
        predict_command.main([f"ckpt_path={bad}", "input=test"])
    assert "is not a readable checkpoint" in caplog.text
    assert victim.read_text() == "kept"


def predict_on_two_processes(
    checkpoint: Path, input: Path, output: Path, *options: str, cwd: Path
) -> subprocess.CompletedProcess:
    """`python -m kindling.predict ... devices=2` on the CPU, checked to have run 2 processes."""
    result = run_forked(
        "-m kindling.predict", [f"ckpt_path={checkpoint}", f"input={input}", f"output={output}",
                                "devices=2", "accelerator=cpu", *options],
        cwd=cwd, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Starting with 2 processes" in result.stderr
    return result


@pytest.mark.slow
def test_two_processes_write_each_file_once_in_the_folder_s_order(
    checkpoint: Path, tmp_path: Path
) -> None:
    digits = load_digits()
    folder = tmp_path / "images"
    (folder / "b").mkdir(parents=True)
    for i in range(13):  # an odd count: the processes' shares differ
        pixels = torch.tensor(digits.images[i] * 255 / 16).round().to(torch.uint8)[None]
        write_png(pixels, str(folder / ("b" if i % 3 else "") / f"digit_{i:02d}.png"))
    (folder / "b" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(40)))
    output = tmp_path / "out" / "p.csv"
    result = predict_on_two_processes(checkpoint, folder, output, "num_workers=0", cwd=tmp_path)
    assert "Predicting" in result.stdout + result.stderr  # the progress bar
    rows = read_csv(output)
    files = sorted(str(f) for f in folder.rglob("digit_*.png"))
    assert [r["file"] for r in rows] == files  # every readable file once, in a stable order
    assert result.stderr.count(f"Skipped {folder / 'b' / 'corrupt.png'}") == 1
    assert "1 of 14 files could not be decoded" in result.stderr
    # The merged file agrees with one process, and no part files are left behind.
    one = predict(
        PredictArgs(str(checkpoint), str(folder), str(tmp_path / "one.csv"), num_workers=0)
    )
    assert read_csv(one) == rows
    assert sorted(p.name for p in output.parent.iterdir()) == ["p.csv"]


# A table of sequences (data=sequences): a small net trained on the learnable task of
# tests/test_sequences.py, once per session and shared by the pytest-xdist workers. Three epochs
# classify every new sequence right (one: 90%).
SEQUENCE_RUN = [
    "data=sequences", "data.min_epoch_size=0", "data.batch_size=16", "model=temporal_conv",
    "model.net.channels=[16,32]",
    "model.net.kernel_sizes=[5,3]", "model.optimizer.lr=0.003", "trainer=cpu",
    "trainer.max_epochs=3", "callbacks.plots=null", "test=false",
    *QUIET,
]  # fmt: skip


def _train_on_sequences(folder: Path) -> float:
    table = write_table(pattern_rows(150, seed=0), folder / "train.parquet")
    return run(compose_in(folder, f"data.path={table}", *SEQUENCE_RUN))


@pytest.fixture(scope="session")
def sequence_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder, _ = made_once(tmp_path_factory, "predict_sequence_run", _train_on_sequences)
    return folder / "run" / "checkpoints" / "last.ckpt"


def first_appearances(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(row["id"] for row in rows))


@pytest.mark.slow
def test_predicts_each_sequence_of_a_table_once(sequence_checkpoint: Path, tmp_path: Path) -> None:
    rows = pattern_rows(60, seed=7)  # sequences it never saw, rows shuffled, labelled
    table = write_table(rows, tmp_path / "new.csv")
    output = predict(PredictArgs(str(sequence_checkpoint), str(table), str(tmp_path / "p.csv")))
    predicted = read_csv(output)
    assert list(predicted[0]) == ["id", "class", "probability"]
    assert [r["id"] for r in predicted] == first_appearances(rows)  # each id once, in order
    truth = {row["id"]: row["label"] for row in rows}
    correct = sum(r["class"] == truth[r["id"]] for r in predicted)  # class names
    assert correct / len(predicted) >= 0.9
    assert all(1 / 3 <= float(r["probability"]) <= 1.0 for r in predicted)


@pytest.mark.slow
def test_a_sequence_is_standardised_with_the_checkpoint_s_statistics(
    sequence_checkpoint: Path, tmp_path: Path
) -> None:
    """Alone, without its label, its columns in another order, a sequence gets the row it gets
    among others: statistics of the table predicted (here: of one sequence) never enter."""
    rows = pattern_rows(12, seed=8)
    together = read_csv(predict(PredictArgs(
        str(sequence_checkpoint), str(write_table(rows, tmp_path / "all.parquet")),
        str(tmp_path / "all.csv"),
    )))  # fmt: skip
    alone_rows = [{k: row[k] for k in ("z", "time", "id", "x", "y")} for row in rows
                  if row["id"] == "s4"]  # fmt: skip
    alone = read_csv(predict(PredictArgs(
        str(sequence_checkpoint), str(write_table(alone_rows, tmp_path / "one.csv")),
        str(tmp_path / "one.csv.out"),
    )))  # fmt: skip
    assert alone == [r for r in together if r["id"] == "s4"]
    # And the probability is the checkpoint's module's on the steps standardised by hand.
    module, checkpoint = load_module(sequence_checkpoint)
    state = checkpoint["SequenceTableDataModule"]
    steps = torch.tensor([[r["x"], r["y"], r["z"]] for r in sorted(alone_rows,
                          key=lambda r: r["time"])], dtype=torch.float32)  # fmt: skip
    standardised = ((steps - state["mean"]) / state["std"])[None]
    with torch.no_grad():
        probability = module(standardised, torch.tensor([len(steps)])).softmax(dim=-1).max()
    assert float(alone[0]["probability"]) == pytest.approx(float(probability), abs=1e-6)


@pytest.mark.slow
def test_a_table_with_other_feature_columns_is_refused_in_one_line(
    sequence_checkpoint: Path, tmp_path: Path, caplog
) -> None:
    rows = pattern_rows(6, seed=9)
    cases = {
        "renamed": ([{("w" if k == "z" else k): v for k, v in r.items()} for r in rows],
                    "has no feature column 'z', which the checkpoint was trained on"),
        "extra": ([{**r, "w": 1.0} for r in rows],
                  "has a column 'w' that is not a feature the checkpoint was trained on"),
    }  # fmt: skip
    for name, (table_rows, message) in cases.items():
        table = write_table(table_rows, tmp_path / f"{name}.csv")
        caplog.clear()
        with pytest.raises(SystemExit):
            predict_command.main([f"ckpt_path={sequence_checkpoint}", f"input={table}",
                                  f"output={tmp_path / 'p.csv'}"])  # fmt: skip
        (line,) = error_lines(caplog)
        assert message in line and "\n" not in line, line
    # The reader's own refusals name the argument: input=, not the training config's data.path.
    rows[3]["x"] = float("nan")
    table = write_table(rows, tmp_path / "nan.parquet")
    with pytest.raises(UserError, match=r"^input=.*nan.parquet: column 'x' row 4 is empty or NaN"):
        predict(PredictArgs(str(sequence_checkpoint), str(table), str(tmp_path / "p.csv")))


@pytest.mark.slow
def test_the_test_split_of_a_sequence_table_names_its_ids(
    sequence_checkpoint: Path, tmp_path: Path
) -> None:
    output = predict(PredictArgs(str(sequence_checkpoint), "test", str(tmp_path / "t.csv")))
    predicted = read_csv(output)
    assert len(predicted) == 30  # a fifth of 150
    assert len({r["id"] for r in predicted}) == 30 and all(r["id"][0] == "s" for r in predicted)


@pytest.mark.slow
def test_two_processes_predict_each_sequence_once(
    sequence_checkpoint: Path, tmp_path: Path
) -> None:
    rows = pattern_rows(13, seed=10)  # an odd count: the processes' shares differ
    table = write_table(rows, tmp_path / "new.parquet")
    output = tmp_path / "out" / "p.csv"
    predict_on_two_processes(sequence_checkpoint, table, output, "batch_size=4", cwd=tmp_path)
    two = read_csv(output)
    assert [r["id"] for r in two] == first_appearances(rows)
    one = predict(PredictArgs(str(sequence_checkpoint), str(table), str(tmp_path / "one.csv"),
                              batch_size=4))  # fmt: skip
    assert read_csv(one) == two
    assert sorted(p.name for p in output.parent.iterdir()) == ["p.csv"]


def test_output_that_predicting_would_destroy_or_cannot_write_is_refused_before_any_work(
    checkpoint: Path, tmp_path: Path, caplog, monkeypatch
) -> None:
    own = tmp_path / "model.ckpt"
    own.write_bytes(checkpoint.read_bytes())
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "images").mkdir()
    cases = {
        ("output=notes.txt",): "output=notes.txt exists and is not a CSV of predictions",
        ("output=picture.png",): "output=picture.png exists and is not a CSV of predictions",
        ("output=model.ckpt", "overwrite=true"): "output=model.ckpt is the checkpoint it reads",
        ("output=images",): "output=images is a folder: name the CSV file to write",
        ("output=notes.txt/predictions.csv",): "output=notes.txt/predictions.csv cannot be "
        f"written: {tmp_path / 'notes.txt'} is not a folder you can write",
    }
    os.mkfifo(tmp_path / "pipe")  # a rename over it would leave a file in its place
    cases[("output=pipe",)] = "output=pipe is not a regular file (a device, a pipe or a socket)"
    # /proc takes no new file, root's either: a folder nobody can write into.
    cases[("output=/proc/p.csv",)] = "output=/proc/p.csv cannot be written: /proc is not a folder"
    if os.geteuid() != 0:  # root writes into a read-only folder
        (tmp_path / "readonly").mkdir(mode=0o555)
        cases[("output=readonly/p.csv",)] = f"{tmp_path / 'readonly'} is not a folder you can"
    before = {path: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(predict_command, "load_module", lambda path: pytest.fail("work began"))
    for args, message in cases.items():
        caplog.clear()
        with pytest.raises(SystemExit) as stopped:
            predict_command.main(["ckpt_path=model.ckpt", "input=test", *args])
        assert stopped.value.code == 1
        (line,) = error_lines(caplog)
        assert message in line, line
    assert {path: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()} == before
    assert (tmp_path / "pipe").is_fifo()


def test_overwrite_replaces_a_file_and_a_csv_of_predictions_is_replaced_as_it_stands(
    checkpoint: Path, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    args = {"ckpt_path": str(checkpoint), "input": "test", "output": str(notes)}
    predict(PredictArgs(**args, overwrite=True))
    assert len(read_csv(notes)) == 359
    predict(PredictArgs(**args))  # its own earlier result: no overwrite=true needed
    assert len(read_csv(notes)) == 359
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]  # no partial file left


def test_a_checkpoint_without_statistics_is_refused_by_predict_and_export_alike() -> None:
    for state, what in (({}, "image"), ({"features": ["x"]}, "feature")):
        checkpoint = {"config": {"data": {"_target_": "kindling.data.X"}}, "X": state}
        with pytest.raises(UserError, match=f"m.ckpt has no {what} statistics"):
            data_state(checkpoint, "m.ckpt")
