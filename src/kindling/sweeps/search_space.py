"""Hydra's sweep syntax as Optuna distributions.

`interval(a, b)` is a float (or int, if both ends are) between a and b; `tag(log, interval(a, b))`
the same on a log scale; `range(a, b[, step])` the integers of Python's `range` (b excluded);
`choice(x, y, ...)` one of the values. A plain value (`trainer.max_epochs=5`) is passed to every
trial unchanged.
"""

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from kindling.config.errors import UserError


def parse_search_space(overrides: list[str]) -> tuple[dict[str, BaseDistribution], list[str]]:
    """Split overrides into the distributions to sample and the overrides every trial gets."""
    distributions: dict[str, BaseDistribution] = {}
    fixed: list[str] = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override():
            distributions[override.get_key_element()] = to_distribution(override)
        else:
            fixed.append(override.input_line)
    return distributions, fixed


def to_distribution(override: Override) -> BaseDistribution:
    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        # Lists and strings become override strings, e.g. "[16,32]", that Hydra reads back.
        return CategoricalDistribution(list(override.sweep_iterator(Transformer.encode)))
    if override.is_range_sweep():
        numbers = list(override.sweep_iterator())
        if not numbers:
            raise UserError(f"{override.input_line}: the range is empty.")
        if all(isinstance(x, int) for x in numbers):
            return IntDistribution(numbers[0], numbers[-1], step=int(value.step))
        return CategoricalDistribution(numbers)
    if override.is_interval_sweep():
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    raise UserError(f"{override.input_line}: the Optuna sweeper cannot sample this sweep.")
