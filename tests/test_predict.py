"""Predicting from a checkpoint alone: a folder of image files, or a data set split, to CSV."""

import csv
import logging
import subprocess
from pathlib import Path

import pytest
import torch
from sklearn.datasets import load_digits
from torchvision.io import write_png

from kindling import predict as predict_command
from kindling.predict import PredictArgs, predict

from conftest import PYTHON


@pytest.fixture
def checkpoint(trained_run) -> Path:
    return trained_run.last_checkpoint


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_predicts_a_folder_of_image_files(checkpoint: Path, tmp_path: Path) -> None:
    digits = load_digits()
    folder = tmp_path / "images"
    (folder / "nested").mkdir(parents=True)
    for i in range(40):
        pixels = torch.tensor(digits.images[i] * 255 / 16).round().to(torch.uint8)[None]
        # 16x16 files: prediction resizes them to the model's 8x8.
        big = pixels.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)
        write_png(big, str(folder / ("nested" if i % 2 else "") / f"digit_{i:02d}.png"))
    (folder / "notes.txt").write_text("not an image")

    output = predict(
        PredictArgs(ckpt_path=str(checkpoint), input=str(folder), output=str(tmp_path / "p.csv"))
    )
    rows = read_rows(output)
    assert len(rows) == 40
    assert all(0.0 <= float(r["probability"]) <= 1.0 for r in rows)
    # The model learnt the digits: its predictions on the files match the labels.
    by_name = {Path(r["file"]).name: int(r["class"]) for r in rows}
    correct = sum(by_name[f"digit_{i:02d}.png"] == digits.target[i] for i in range(40))
    assert correct >= 34


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
    rows = read_rows(output)
    assert [Path(r["file"]).name for r in rows] == [f"digit_{i}.png" for i in range(5)]
    assert f"Skipped {folder / 'corrupt.png'}" in caplog.text
    assert "1 of 6 files could not be decoded" in caplog.text


def test_predicts_a_data_set_split(checkpoint: Path, tmp_path: Path) -> None:
    output = predict(
        PredictArgs(ckpt_path=str(checkpoint), input="test", output=str(tmp_path / "t.csv"))
    )
    rows = read_rows(output)
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
    }
    monkeypatch.chdir(tmp_path)
    for args, message in cases.items():
        caplog.clear()
        with pytest.raises(SystemExit) as stopped:
            predict_command.main(list(args))
        assert stopped.value.code == 1
        (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert message in line, line
    # The whole command, once: the message alone on stderr, no traceback.
    result = subprocess.run(
        [*PYTHON, "-m", "kindling.predict", f"ckpt_path={checkpoint}", "input=nowhere"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert "input=nowhere is not a folder" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
