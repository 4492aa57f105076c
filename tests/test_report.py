"""The report of a multirun: job and configuration tables, seeds and folds aggregated, the plot."""

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from kindling.report import build_report, configuration_rows, job_rows, main, markdown

from helpers import error_lines, read_csv, train_py


def write_job(
    sweep: Path,
    number: int,
    overrides: list[str],
    status: str | None = "completed",
    results: dict[str, float] | None = None,
    trial_state: str | None = None,
    metric: str = "val/acc_best",
    direction: str | None = None,
) -> None:
    """A job folder as a multirun leaves it: Hydra's .hydra/, job.yaml, results.yaml, trial.yaml."""
    folder = sweep / str(number)
    (folder / ".hydra").mkdir(parents=True)
    files: dict[str, Any] = {
        ".hydra/overrides.yaml": overrides,
        ".hydra/config.yaml": {"optimized_metric": metric, "seed": 0},
        ".hydra/hydra.yaml": {"hydra": {"sweeper": {"direction": direction} if direction else {}}},
    }
    if status is not None:
        files["job.yaml"] = {"status": status, "run_time_s": 2.5}
    if results is not None:
        files["results.yaml"] = results
    if trial_state is not None:
        files["trial.yaml"] = {"number": number, "state": trial_state}
    for name, content in files.items():
        (folder / name).write_text(yaml.safe_dump(content))


def test_jobs_and_configurations_with_seeds_aggregated_best_first(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    accuracies = {"cnn": [0.8, 0.9, 1.0], "lstm": [0.95, 0.97, None]}
    number = 0
    for seed in range(3):
        for model, values in accuracies.items():
            value = values[seed]
            results = None if value is None else {"val/acc_best": value, "test/acc": value - 0.1}
            write_job(
                sweep, number, [f"model={model}", f"seed={seed}", "trainer.max_epochs=3"],
                status="failed" if value is None else "completed", results=results,
            )  # fmt: skip
            number += 1
    # Killed while it ran (started, never ended), and one without a job record at all.
    write_job(sweep, 6, ["model=lstm", "seed=3", "trainer.max_epochs=3"], status="running")
    write_job(sweep, 7, ["model=cnn", "seed=3", "trainer.max_epochs=3"], status=None)

    report = build_report(sweep)
    assert [job.status for job in report.jobs] == [
        *["completed"] * 5, "failed", "interrupted", "interrupted",
    ]  # fmt: skip
    rows = configuration_rows(report)
    # lstm (0.96 over its two completed seeds) beats cnn (0.9): listed first.
    assert [row["configuration"] for row in rows] == ["model=lstm", "model=cnn"]
    lstm, cnn = rows
    assert (lstm["completed"], lstm["jobs"], cnn["completed"], cnn["jobs"]) == (2, 4, 3, 4)
    assert lstm["val/acc_best mean"] == pytest.approx(0.96)
    assert lstm["val/acc_best std"] == pytest.approx(0.0141421, abs=1e-6)
    assert cnn["val/acc_best mean"] == pytest.approx(0.9)
    assert cnn["val/acc_best std"] == pytest.approx(0.1)
    assert cnn["test/acc mean"] == pytest.approx(0.8) and cnn["test/acc n"] == 3
    jobs = job_rows(report)
    # Only what varies between jobs names them: not trainer.max_epochs=3, which all share.
    assert jobs[0]["overrides"] == "model=cnn seed=0"
    assert jobs[0]["folder"] == str((sweep / "0").resolve()) and jobs[0]["run_time_s"] == 2.5
    text = markdown(report)
    assert "| model=lstm | 2/4 | 0.9600 ± 0.0141 | 0.8600 ± 0.0141 |" in text
    assert "| 5 | model=lstm seed=2 | failed |" in text


def test_a_lower_is_better_metric_and_optuna_trials(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    # An Optuna search minimising val/loss: the pruned trial is a row, not part of any mean.
    for number, (lr, loss, state) in enumerate(
        [(0.1, 0.5, "COMPLETE"), (0.01, 0.2, "COMPLETE"), (0.001, 0.1, "PRUNED")]
    ):
        write_job(
            sweep, number, [f"model.optimizer.lr={lr}"], results={"val/loss": loss},
            trial_state=state, metric="val/loss", direction="minimize",
        )  # fmt: skip
    report = build_report(sweep)
    assert not report.maximize
    assert [job.status for job in report.jobs] == ["completed", "completed", "pruned"]
    rows = configuration_rows(report)
    assert [row["configuration"] for row in rows] == [
        "model.optimizer.lr=0.01", "model.optimizer.lr=0.1", "model.optimizer.lr=0.001",
    ]  # fmt: skip
    assert rows[-1]["completed"] == 0 and rows[-1]["val/loss mean"] is None


def test_a_multirun_extended_by_another_is_reported_with_it(tmp_path: Path) -> None:
    first, later = tmp_path / "first", tmp_path / "later"
    for sweep, seeds in ((first, (0, 1)), (later, (2,))):
        for number, seed in enumerate(seeds):
            write_job(sweep, number, ["model=cnn", f"seed={seed}"], results={"val/acc_best": seed})
    main([str(first), str(later)])
    jobs = read_csv(first / "jobs.csv")
    assert [row["job"] for row in jobs] == ["0", "1", "later/0"]
    (configuration,) = read_csv(first / "configurations.csv")
    assert configuration["configuration"] == "model=cnn" and configuration["completed"] == "3"
    assert float(configuration["val/acc_best mean"]) == pytest.approx(1.0)


@pytest.mark.slow
def test_a_multirun_over_folds_reports_at_its_end_and_the_report_rebuilds(tmp_path: Path) -> None:
    # Two folds, two seeds: seed=x fails in both folds; the others aggregate into one row. A
    # process of its own: a multirun whose jobs failed reports when the process exits.
    result = train_py(
        "-m", "data.folds=2", "data.fold=0,1", "seed=0,x", "trainer=cpu", "debug=limit",
        "trainer.max_epochs=1", "logger=none", "callbacks=none", cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]  # Hydra's end of a multirun with failed jobs
    (sweep,) = (tmp_path / "logs" / "debug" / "multiruns").iterdir()
    # One configuration: named by all its overrides, less the fold and the seed.
    assert re.search(r"\| data\.folds=2 trainer=cpu [^|]* \| 2/4 \| 0\.\d+ ± ", output), output[
        -4000:
    ]
    jobs = read_csv(sweep / "jobs.csv")
    assert [(row["overrides"], row["status"]) for row in jobs] == [
        ("data.fold=0 seed=0", "completed"), ("data.fold=0 seed=x", "failed"),
        ("data.fold=1 seed=0", "completed"), ("data.fold=1 seed=x", "failed"),
    ]  # fmt: skip
    assert all(0.0 < float(row["test/acc"]) <= 1.0 for row in jobs[::2])
    assert float(jobs[0]["run_time_s"]) > 0.0
    (configuration,) = read_csv(sweep / "configurations.csv")
    assert configuration["val/acc_best n"] == "2" and configuration["test/acc n"] == "2"
    assert (sweep / "report.png").stat().st_size > 0

    # The same tables again from the folders alone.
    written = {name: (sweep / name).read_text() for name in ("jobs.csv", "configurations.csv")}
    for name in (*written, "report.md", "report.png"):
        (sweep / name).unlink()
    moved = tmp_path / "moved"
    shutil.move(sweep, moved)
    main([str(moved)])
    for name, text in written.items():
        assert (moved / name).read_text() == text.replace(str(sweep), str(moved))
    assert (moved / "report.png").is_file()


def test_a_folder_without_jobs_is_refused_in_one_line(tmp_path: Path, caplog) -> None:
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path)])
    assert stopped.value.code == 1
    (line,) = error_lines(caplog)
    assert "has no job folders" in line, line


@pytest.mark.parametrize("damaged", [".hydra/overrides.yaml", "job.yaml", ".hydra/config.yaml"])
def test_a_damaged_record_file_is_named_in_one_line_and_the_rest_reported(
    tmp_path: Path, capsys, damaged: str
) -> None:
    sweep = tmp_path / "sweep"
    for number, seed in enumerate(range(3)):
        write_job(sweep, number, ["model=cnn", f"seed={seed}"], results={"val/acc_best": 0.9})
    (sweep / "0" / damaged).write_text("status: [completed\n")  # a cut-off or edited file
    main([str(sweep)])
    output = capsys.readouterr().out
    lines = [line for line in output.splitlines() if "not valid YAML" in line]
    if damaged == ".hydra/config.yaml":  # only where the metric's name is read: the others say it
        assert lines == [] and "| model=cnn | 3/3 | 0.9000 ± 0.0000 |" in output, output
        return
    assert lines == [
        f"{sweep / '0' / damaged} is not valid YAML at line 2: job 0 is left out of the report."
    ]
    assert "| model=cnn | 2/2 | 0.9000 ± 0.0000 |" in output, output
