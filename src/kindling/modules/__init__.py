"""LightningModules: a task (loss, metrics, optimisation) wrapped around any plain net."""
