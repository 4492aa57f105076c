"""kindling's Optuna sweeper, as Hydra finds it: `hydra/sweeper=optuna` (configs/hydra/sweeper).

Hydra imports every module under `hydra_plugins` at start-up, so this one stays light: Optuna
and the sweep itself (kindling.optuna_sweep) load only when a sweep is set up.
"""

from typing import Any

from hydra.plugins.sweeper import Sweeper


class OptunaSweeper(Sweeper):
    def __init__(self, **config: Any) -> None:
        from kindling.optuna_sweep import OptunaSweep

        self.optuna_sweep = OptunaSweep(**config)

    def setup(self, **context: Any) -> None:  # hydra_context, task_function, config
        self.optuna_sweep.setup(**context)

    def sweep(self, arguments: list[str]) -> Any:
        return self.optuna_sweep.sweep(arguments)
