"""Entrypoint: `python train.py [overrides]`. Everything else lives in `kindling.train`."""

import sys

from kindling.garbage_collection import long_lived_imports, skip_collections_at_exit

# The objects torch, Lightning and Hydra create at import live as long as the process: Python's
# collector need not traverse them again and again (kindling/garbage_collection.py).
with long_lived_imports():
    import hydra
    from omegaconf import DictConfig

    from kindling.errors import UserError
    from kindling.run.run_folder import launched
    from kindling.train import run


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # The returned value is what Hydra sweepers (e.g. Optuna) optimise.
    return run(cfg)


if __name__ == "__main__":
    skip_collections_at_exit()
    # `ckpt_path=<file>`: the run is composed with the overrides it was trained with, then the
    # command's (kindling/run/starting_checkpoint.py).
    if any("ckpt_path=" in arg for arg in sys.argv[1:]):
        from kindling.run.starting_checkpoint import with_checkpoint_overrides

        sys.argv[1:] = with_checkpoint_overrides(sys.argv[1:])
    if launched():  # by torchrun or in a SLURM job (kindling/run/launched.py)
        from kindling.run.launched import check_launch

        try:
            check_launch()  # before Hydra composes: the ranks must name one run folder
        except UserError as error:
            sys.exit(str(error))  # one line on stderr, exit status 1
    main()
