"""What a run prints: a pointer to its config tree, no notices that ask nothing of the user, and
a summary at the end; and what its train.log keeps: all of that, Lightning's lines too."""

import logging
import subprocess
import sys
import warnings

import pytest
from lightning.pytorch.utilities.rank_zero import rank_zero_only

import kindling.train
from kindling.config.config_tree import CONFIG_TREE_FILE, print_config_tree
from kindling.train import run

from helpers import QUIET, train_py


def test_config_tree_is_saved_resolved_and_printed_on_request(
    compose_config, tmp_path, capsys
) -> None:
    cfg = compose_config("model=lstm", "tags=[digits,lstm]")
    print_config_tree(cfg, tmp_path / "run")
    assert "LSTMClassifier" not in capsys.readouterr().out  # saved; the log says where
    print_config_tree(cfg, tmp_path / "run", to_console=True)
    saved = (tmp_path / "run" / CONFIG_TREE_FILE).read_text()
    assert "kindling.models.recurrent.LSTMClassifier" in capsys.readouterr().out
    # Interpolations are resolved: the checkpoint folder is the run folder's.
    assert f"dirpath: {tmp_path / 'run'}/checkpoints" in saved
    assert "${" not in saved
    assert "_target_: kindling.models.recurrent.LSTMClassifier" in saved
    assert "tags: [digits, lstm]" in saved and "seed: 12345" in saved
    for group in ["data", "model", "callbacks", "logger", "trainer", "paths"]:
        assert f"── {group}\n" in saved
    assert "\x1b[" not in saved  # no colour codes in the file


def test_config_tree_is_highlighted_on_a_colour_console_only(
    compose_config, capsys, monkeypatch
) -> None:
    cfg = compose_config()
    print_config_tree(cfg)  # captured: no colour, the YAML as plain text
    plain = capsys.readouterr().out
    assert "\x1b[" not in plain and "_target_: kindling.modules.classifier.Classifier" in plain
    monkeypatch.setenv("FORCE_COLOR", "1")
    print_config_tree(cfg)
    coloured = capsys.readouterr().out
    # Highlighted YAML: colour codes between a key and its value.
    assert "kindling.modules.classifier.Classifier" in coloured
    assert "_target_: kindling.modules.classifier.Classifier" not in coloured


def test_config_tree_only_on_rank_zero(compose_config, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    print_config_tree(compose_config(), tmp_path / "run")
    assert not (tmp_path / "run" / CONFIG_TREE_FILE).exists()
    assert capsys.readouterr().out == ""


def run_recording_warnings(compose_config, caplog, monkeypatch) -> tuple[list[str], str]:
    """The warnings and the log of a short run: debug=limit (5 training batches, logging every
    10 steps) provokes the unhelpful ones; early stopping ends it at its first validation, and
    with no checkpoint callback there is no best checkpoint to test, which it says: a warning
    that tells the user something."""
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    monkeypatch.setattr(rank_zero_logger, "filters", [])  # restored after the test
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(
            compose_config(
                "debug=limit", "trainer=cpu", "optimized_metric=null", *QUIET,
                "callbacks=[default,early_stopping]", "trainer.enable_checkpointing=false",
                "+callbacks.early_stopping.stopping_threshold=1e9",  # any val/loss stops it
            )
        )  # fmt: skip
    # A run under Hydra logs Python's warnings (train.log keeps them): recorded, or in the log.
    return [str(w.message) for w in caught] + caplog.text.splitlines(), caplog.text


UNHELPFUL = ["smaller than the logging interval", "LeafSpec"]
# Lightning's notices, logged at every Trainer start (the last one beside a model summary).
UNHELPFUL_NOTICES = ["litlogger", "was configured so 100%"]


def test_a_real_run_saves_its_config_tree_without_unhelpful_warnings(
    compose_config, tmp_path, caplog, monkeypatch
) -> None:
    messages, log = run_recording_warnings(compose_config, caplog, monkeypatch)
    for unhelpful in UNHELPFUL:
        assert not [m for m in messages if unhelpful in m], unhelpful
    for notice in UNHELPFUL_NOTICES:
        assert notice not in log, notice
    # What tells the user something still gets through.
    assert any("No best checkpoint was saved" in m for m in messages)
    assert f"Run folder: {tmp_path / 'run'}" in log
    # train.py saves the tree in the run folder.
    assert (
        "_target_: kindling.modules.classifier.Classifier"
        in (tmp_path / "run" / CONFIG_TREE_FILE).read_text()
    )


def test_without_the_filter_those_warnings_do_appear(compose_config, caplog, monkeypatch) -> None:
    """The test above means something only if the run really raises these warnings."""
    monkeypatch.setattr(kindling.train, "ignore_unhelpful_warnings", lambda: None)
    messages, log = run_recording_warnings(compose_config, caplog, monkeypatch)
    for unhelpful in UNHELPFUL:
        assert [m for m in messages if unhelpful in m], unhelpful
    for notice in UNHELPFUL_NOTICES:
        assert notice in log, notice


@pytest.mark.slow
def test_the_console_is_short_ends_with_a_summary_and_train_log_keeps_it(tmp_path) -> None:
    """`python train.py`: the config tree is a one-line pointer, Lightning's notices and the
    srun hint (on a machine with SLURM's commands) are gone, a summary ends the run; train.log
    holds Lightning's lines and the summary too."""
    result = train_py("debug=limit", "trainer.max_epochs=2", cwd=tmp_path)
    console = result.stdout + result.stderr
    assert result.returncode == 0, console[-3000:]
    (run_dir,) = (tmp_path / "logs" / "debug" / "runs").iterdir()
    assert f"Config: {run_dir / CONFIG_TREE_FILE}" in console
    assert "── data" not in console and "_target_:" not in console
    quiet = [*UNHELPFUL_NOTICES, "Trainer already configured", "The `srun` command is available"]
    for noise in quiet:
        assert noise not in console, noise
    summary = console[console.index("Best: val/") :]
    assert summary.splitlines()[1].startswith("Test: test/acc ")
    assert summary.splitlines()[1].endswith(" (the weights training ended with)")
    assert f"Run folder: {run_dir}" in summary
    log = (run_dir / "train.log").read_text()
    assert "`Trainer.fit` stopped: `max_epochs=2` reached." in log
    assert "Test: test/acc " in log and f"Config: {run_dir / CONFIG_TREE_FILE}" in log


def test_the_progress_bar_takes_a_batch_at_most_refresh_rate_times_a_second(monkeypatch) -> None:
    """Its per-step cost is bounded by its refresh: 1,000 batches in 1 s, at 10 a second, reach
    Lightning's bar 10 times and once more at the last batch."""
    from lightning.pytorch.callbacks import RichProgressBar

    from kindling.callbacks import progress

    clock = iter(i / 1000 for i in range(10_000))
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    passed: list[int] = []
    monkeypatch.setattr(RichProgressBar, "on_train_batch_end", lambda *a: passed.append(a[-1]))
    monkeypatch.setattr(progress.ThrottledRichProgressBar, "total_train_batches", 1000)
    monkeypatch.setattr(progress.ThrottledRichProgressBar, "is_enabled", True)  # rank 0's
    bar = progress.ThrottledRichProgressBar(refresh_rate=10)
    for batch_idx in range(1000):
        bar.on_train_batch_end(None, None, None, None, batch_idx)
    assert len(passed) == 11 and passed[0] == 0 and passed[-1] == 999, passed


@pytest.mark.slow
def test_predict_and_prepare_keep_the_quiet_console_of_a_training_run(
    trained_run, tmp_path
) -> None:
    """Each tool in its own process (what it prints is a process's): the notices a training run
    filters, and LitData's setup, worker and sign-up lines, do not reach the console."""
    rows = [f"s{n},{t},{'ab'[n % 2]},{(t * n) % 7}" for n in range(40) for t in range(5 + n % 9)]
    (tmp_path / "table.csv").write_text("\n".join(["id,time,label,x", *rows]) + "\n")
    tools = {
        "predict": ["kindling.predict", f"ckpt_path={trained_run.last_checkpoint}", "input=test",
                    f"output={tmp_path / 'predictions.csv'}"],
        "prepare": ["kindling.prepare", "data=sequences", f"data.path={tmp_path / 'table.csv'}",
                    f"output={tmp_path / 'copy'}"],
    }  # fmt: skip
    noise = ["litlogger", "litmodels", "The `srun` command", "set_vital", "Create an account",
             "Setting multiprocessing", "Workers are", "max_cache_size"]  # fmt: skip
    for tool, args in tools.items():
        result = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, capture_output=True,
                                text=True, timeout=300)  # fmt: skip
        console = result.stdout + result.stderr
        assert result.returncode == 0, console[-3000:]
        assert not [n for n in noise if n in console], (tool, console[-3000:])
        assert len(console.splitlines()) <= 8, (tool, console)
