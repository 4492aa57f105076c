"""A package's names, each imported from its module when first used (PEP 562).

`kindling.data.DigitsDataModule` (in a config or an import) then loads `kindling/data/digits.py`
and what it imports, not every data module of the package: a run loads the code it runs.
"""

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, modules: dict[str, list[str]]
) -> tuple[Callable[[str], Any], list[str]]:
    """The `__getattr__` and `__all__` of `package`, whose names live in its `modules`
    (`{"digits": ["DigitsDataModule"], ...}`)."""
    homes = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    return __getattr__, sorted(homes)
