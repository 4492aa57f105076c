"""Checks that the private parts of a library kindling patches are still what it expects.

`kindling.utils.lightning_patches` and `kindling.utils.hydra_patches` check their targets with
these at import, and stop with one line naming the installed version and the supported range.
"""

import inspect
from collections.abc import Callable
from types import CodeType

from kindling.utils.errors import UserError


def requirement(
    error: type[UserError], package: str, version: str, supported: str
) -> Callable[[bool, str], None]:
    """`require(condition, what)`: raise `error` naming `what` when `condition` is false."""

    def require(condition: bool, what: str) -> None:
        if not condition:
            raise error(
                f"kindling relies on {what}, which {package} {version} does not have. "
                f"Install a version kindling supports: pip install '{supported}'."
            )

    return require


def calls(function: Callable, name: str, *, nested: bool = False) -> bool:
    """Whether `function`'s code names `name` (a global or an attribute), so replacing it takes
    effect; with `nested`, the code of the functions and lambdas it defines counts too."""
    codes = [inspect.unwrap(function).__code__]
    while codes:
        code = codes.pop()
        if name in code.co_names:
            return True
        if nested:
            codes += [const for const in code.co_consts if isinstance(const, CodeType)]
    return False
