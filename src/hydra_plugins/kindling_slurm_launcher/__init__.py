"""kindling's SLURM launcher, as Hydra finds it: `hydra/launcher=slurm` (configs/hydra/launcher)."""
