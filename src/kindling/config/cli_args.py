"""The `key=value` arguments of kindling's module commands (predict, export), as a dataclass."""

from typing import TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kindling.config.errors import UserError

Args = TypeVar("Args")


def parse_cli_args(args_class: type[Args], argv: list[str], usage: str) -> Args:
    """`argv` merged into `args_class`'s defaults; an unknown key, a wrong type or a missing
    value is one line with the usage."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(args_class), OmegaConf.from_cli(argv))
        return args_class(**OmegaConf.to_container(merged, throw_on_missing=True))
    except OmegaConfBaseException as error:
        raise UserError(f"{error.msg}. Usage: {usage}") from error
