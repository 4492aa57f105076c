"""Entrypoint: `python train.py [overrides]`. Everything else lives in `kindling.train`."""

import hydra
from omegaconf import DictConfig

from kindling.train import run


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # The returned value is what Hydra sweepers (e.g. Optuna) optimise.
    return run(cfg)


if __name__ == "__main__":
    main()
