"""Entrypoint: `python train.py [overrides]`. Everything else lives in `kindling.train`."""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from kindling.config import resolvers  # noqa: F401 - importing registers the resolvers
from kindling.config.group_overrides import check_group_overrides
from kindling.errors import UserError
from kindling.garbage_collection import ending_without_teardown, import_long_lived
from kindling.run.run_folder import launched

CONFIG_DIR = Path(__file__).parent / "configs"


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # Imported here, when a run starts: `--help`, `--cfg` and shell completion compose the
    # config without torch and Lightning's seconds of imports.
    train = import_long_lived("kindling.train")
    # The returned value is what Hydra sweepers (e.g. Optuna) optimise.
    return train.run(cfg)


if __name__ == "__main__":
    with ending_without_teardown():  # kindling/garbage_collection.py
        # Checks before Hydra composes, each refusing in one line on stderr (exit status 1).
        try:
            check_group_overrides(sys.argv[1:], CONFIG_DIR)
            # `ckpt_path=<file>` or `last`: the run is composed with the overrides it was
            # trained with, then the command's (kindling/run/starting_checkpoint.py).
            if any("ckpt_path=" in arg for arg in sys.argv[1:]):
                from kindling.run.starting_checkpoint import with_checkpoint_overrides

                sys.argv[1:] = with_checkpoint_overrides(sys.argv[1:], CONFIG_DIR)
            if launched():  # by torchrun or in a SLURM job (kindling/run/launched.py)
                from kindling.run.launched import check_launch

                check_launch()  # the ranks must name one run folder
        except UserError as error:
            sys.exit(str(error))
        try:
            main()
        except KeyboardInterrupt:  # outside training (composing, loading): nothing to save
            print("Stopped by Ctrl-C.", file=sys.stderr)
            sys.exit(130)
