"""kindling's Optuna sweeper, as Hydra finds it: `hydra/sweeper=optuna` (configs/hydra/sweeper).

Hydra imports every module under `hydra_plugins` at start-up, so this one stays light: Optuna
and the sweep itself (kindling.sweeps.optuna_sweep) load only when a sweep is set up.
"""

from typing import Any

from hydra.errors import CompactHydraException
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class OptunaSweeper(Sweeper):
    def __init__(self, **config: Any) -> None:
        from kindling.sweeps.optuna_sweep import OptunaSweep

        self.optuna_sweep = OptunaSweep(**config)

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.optuna_sweep.setup(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from kindling.config.errors import UserError

        try:
            return self.optuna_sweep.sweep(arguments)
        except UserError as error:  # a search space it cannot sample: Hydra prints one line
            if isinstance(error, CompactHydraException):
                raise
            raise CompactHydraException(str(error)) from error
