"""What a run prints: the resolved config tree, and no warnings that ask nothing of the user."""

import logging
import warnings

from lightning.pytorch.utilities.rank_zero import rank_zero_only

import kindling.train
from kindling.config.config_tree import CONFIG_TREE_FILE, print_config_tree
from kindling.train import run

from conftest import QUIET


def test_config_tree_is_printed_and_saved_resolved(compose_config, tmp_path, capsys) -> None:
    cfg = compose_config("model=lstm", "tags=[digits,lstm]")
    print_config_tree(cfg, tmp_path / "run")
    saved = (tmp_path / "run" / CONFIG_TREE_FILE).read_text()
    assert "kindling.models.LSTMClassifier" in capsys.readouterr().out
    # Interpolations are resolved: the checkpoint folder is the run folder's.
    assert f"dirpath: {tmp_path / 'run'}/checkpoints" in saved
    assert "${" not in saved
    assert "_target_: kindling.models.LSTMClassifier" in saved
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
    assert "\x1b[" not in plain and "_target_: kindling.modules.Classifier" in plain
    monkeypatch.setenv("FORCE_COLOR", "1")
    print_config_tree(cfg)
    coloured = capsys.readouterr().out
    # Highlighted YAML: colour codes between a key and its value.
    assert "kindling.modules.Classifier" in coloured
    assert "_target_: kindling.modules.Classifier" not in coloured


def test_config_tree_only_on_rank_zero(compose_config, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    print_config_tree(compose_config(), tmp_path / "run")
    assert not (tmp_path / "run" / CONFIG_TREE_FILE).exists()
    assert capsys.readouterr().out == ""


def run_recording_warnings(compose_config, caplog, monkeypatch) -> tuple[list[str], str]:
    """The warnings and the log of a short run: debug=limit (5 training batches, logging every
    10 steps) provokes the unhelpful ones; stopped after 3 steps, before any validation, it tests
    without a best checkpoint and says so, a warning that tells the user something."""
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    monkeypatch.setattr(rank_zero_logger, "filters", [])  # restored after the test
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(
            compose_config(
                "debug=limit", "trainer=cpu", "trainer.max_steps=3", "optimized_metric=null",
                *QUIET,
            )
        )  # fmt: skip
    return [str(w.message) for w in caught], caplog.text


UNHELPFUL = ["smaller than the logging interval", "LeafSpec"]


def test_a_real_run_saves_its_config_tree_without_unhelpful_warnings(
    compose_config, tmp_path, caplog, monkeypatch
) -> None:
    messages, log = run_recording_warnings(compose_config, caplog, monkeypatch)
    for unhelpful in UNHELPFUL:
        assert not [m for m in messages if unhelpful in m], unhelpful
    assert "litlogger" not in log
    # What tells the user something still gets through.
    assert any("No best checkpoint was saved" in m for m in messages)
    assert f"Run folder: {tmp_path / 'run'}" in log
    # train.py prints the tree and saves it in the run folder.
    assert (
        "_target_: kindling.modules.Classifier" in (tmp_path / "run" / CONFIG_TREE_FILE).read_text()
    )


def test_without_the_filter_those_warnings_do_appear(compose_config, caplog, monkeypatch) -> None:
    """The test above means something only if the run really raises these warnings."""
    monkeypatch.setattr(kindling.train, "ignore_unhelpful_warnings", lambda: None)
    messages, log = run_recording_warnings(compose_config, caplog, monkeypatch)
    for unhelpful in UNHELPFUL:
        assert [m for m in messages if unhelpful in m], unhelpful
    assert "litlogger" in log
