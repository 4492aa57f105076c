"""Entrypoint: `python train.py [overrides]`. Everything else lives in `kindling.train`."""

import logging
import sys

import hydra
from omegaconf import DictConfig

from kindling.train import run
from kindling.utils import UserError


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        # The returned value is what Hydra sweepers (e.g. Optuna) optimise.
        return run(cfg)
    except UserError as error:
        logging.getLogger("kindling").error("%s", error)
        sys.exit(1)


if __name__ == "__main__":
    main()
