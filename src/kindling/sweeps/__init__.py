"""Hyperparameter search with Optuna, run by Hydra (hydra_plugins.kindling_optuna_sweeper)."""
