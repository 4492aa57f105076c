"""What kindling's `python -m kindling.*` tools share: `key=value` arguments read into a
dataclass, one way to fail (a UserError printed as its one line, exit status 1), the quiet
console of a training run, and the CSV they write."""

import csv
import dataclasses
import functools
import io
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args

from kindling.errors import UserError, find_user_error, message
from kindling.files import write_atomically
from kindling.known_warnings import ignore_unhelpful_warnings

Args = TypeVar("Args")
R = TypeVar("R")


def parse(
    args_class: type[Args], argv: Sequence[str], usage: str, positional: str | None = None
) -> Args:
    """`argv`'s `key=value` arguments read into the dataclass `args_class` by its fields' types
    (`null`: None where a field may be None). Text is taken as typed, never parsed as YAML: a
    prompt or a path stays what the shell gave. Other arguments fill the list field
    `positional`, where the command takes one. `-h`/`--help` prints the command's doc and its
    arguments. A mistake is a UserError naming the argument, with the usage."""
    fields = dataclasses.fields(args_class)  # type: ignore[arg-type]
    if {"-h", "--help"} & set(argv):
        print(sys.modules[args_class.__module__].__doc__)
        for field in fields:
            default = "<required>" if field.default is dataclasses.MISSING else repr(field.default)
            print(f"    {field.name}={default}")
        sys.exit(0)
    types = {field.name: field.type for field in fields if field.name != positional}
    values: dict[str, Any] = {}
    for arg in argv:
        name, sep, text = arg.partition("=")
        if positional and (not sep or name not in types):
            values.setdefault(positional, []).append(arg)
        elif not sep or name not in types:
            raise UserError(
                f"Unknown argument {arg!r}: give key=value, a key among {', '.join(types)}. "
                f"Usage: {usage}"
            )
        elif text == "null" and type(None) in get_args(types[name]):  # `int | None`: None
            values[name] = None
        else:
            kind = (get_args(types[name]) or (types[name],))[0]
            try:
                values[name] = (
                    {"true": True, "false": False}[text.lower()] if kind is bool else kind(text)
                )
            except (KeyError, ValueError):
                what = "true or false" if kind is bool else "a number"
                raise UserError(f"{arg!r}: {name} must be {what}. Usage: {usage}") from None
    for field in fields:
        required = field.default is field.default_factory is dataclasses.MISSING
        if required and field.name not in values:
            raise UserError(f"Missing mandatory value: {field.name}. Usage: {usage}")
    return args_class(**values)


def main(run: Callable[..., R]) -> Callable[..., R]:
    """`run`, a tool's main, ended by a UserError (also one behind another error: Hydra's
    instantiate wraps them) with its message alone and exit status 1, printed by the first
    process only where every process meets it. HYDRA_FULL_ERROR=1 raises it, as train.py does."""

    @functools.wraps(run)
    def main(*args: Any, **kwargs: Any) -> R:
        ignore_unhelpful_warnings()  # the console a training run has
        try:
            return run(*args, **kwargs)
        except Exception as error:
            user_error = find_user_error(error)
            if user_error is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            # Imported here: report and schemas run without Lightning otherwise.
            from lightning.pytorch.utilities import rank_zero_only

            if rank_zero_only.rank == 0 or not user_error.raised_on_every_rank:
                logging.basicConfig(format="%(message)s")  # a command that set up no logging
                logging.getLogger("kindling").error("%s", message(user_error))
            sys.exit(1)

    return main


def command(
    args_class: type[Args], usage: str, positional: str | None = None
) -> Callable[[Callable[[Args], object]], Callable[..., None]]:
    """A tool's `main(argv)` made of `run(args)`: `argv` (`sys.argv[1:]` where not given, as
    `python -m` runs it) parsed into `args_class`, kindling's messages at INFO and the
    libraries' at WARNING, and `main`'s end for a UserError."""

    def decorate(run: Callable[[Args], object]) -> Callable[..., None]:
        @main
        def tool(argv: Sequence[str] | None = None) -> None:
            if argv is None:
                argv = sys.argv[1:]
            logging.basicConfig(level=logging.WARNING, format="%(message)s")
            logging.getLogger("kindling").setLevel(logging.INFO)
            run(parse(args_class, argv, usage, positional))

        return tool

    return decorate


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Iterable[Any]]) -> None:
    """A CSV (None as an empty cell), written beside `path` and renamed into place: a failure
    leaves the file as it was."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(["" if value is None else value for value in row] for row in rows)
    write_atomically(path, lambda file: file.write(text.getvalue().encode()))
