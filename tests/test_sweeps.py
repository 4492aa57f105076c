"""Optuna searches: the best parameters land in the sweep folder; failed trials are skipped."""

from pathlib import Path

import pytest
import yaml

from conftest import train_py

QUICK = [
    "trainer=cpu",
    "debug=limit",
    "callbacks.rich_progress_bar=null",
    "callbacks.rich_model_summary=null",
]


def search(tmp_path: Path, search_config: str, *overrides: str) -> tuple[str, Path]:
    """Run `python train.py -m hparams_search=<search_config>` with configs/ and tmp/configs/."""
    (tmp_path / "configs" / "hparams_search").mkdir(parents=True)
    (tmp_path / "configs" / "hparams_search" / "under_test.yaml").write_text(search_config)
    result = train_py(
        "-m", "hparams_search=under_test", f"hydra.searchpath=[file://{tmp_path / 'configs'}]",
        *QUICK, *overrides, cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    (sweep_dir,) = (tmp_path / "logs" / "debug" / "multiruns").iterdir()
    return output, sweep_dir


@pytest.mark.slow
def test_optuna_search_writes_best_parameters(tmp_path: Path) -> None:
    config = """
# @package _global_
defaults:
  - optuna
hydra:
  sweeper:
    n_trials: 3
    sampler:
      n_startup_trials: 2
"""
    output, sweep_dir = search(tmp_path, config)
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1", "2"]
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert set(results["best_params"]) == {
        "model.optimizer.lr",
        "data.batch_size",
        "model.net.channels",
    }
    assert 0.0 < results["best_value"] <= 1.0
    assert "Best value" in output


@pytest.mark.slow
def test_failed_and_diverged_trials_do_not_end_the_search(tmp_path: Path) -> None:
    config = """
# @package _global_
defaults:
  - optuna
hydra:
  sweeper:
    n_trials: 3
    sampler:  # random trials; with this seed: one that trains, one that diverges, one crash
      seed: 5
      n_startup_trials: 10
    params:
      data.batch_size: choice(0, 64)
      model.optimizer.lr: choice(0.003, 1e12)
      model.net.channels: choice([8, 16])
"""
    output, sweep_dir = search(tmp_path, config)
    # A crash (bad input) and a divergence are both reported as failed trials...
    assert "data.batch_size must be a positive integer, got 0" in output
    assert "Failed experiment: The training loss was NaN or inf" in output
    # ...and the search finished, with the one setting that trains as the best.
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["best_params"]["model.optimizer.lr"] == 0.003
    assert results["best_params"]["data.batch_size"] == 64
