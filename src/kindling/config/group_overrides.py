"""Config-group overrides that Hydra refuses with a traceback, refused in one line instead."""

from collections.abc import Sequence
from pathlib import Path

from kindling.errors import UserError


def check_group_overrides(args: Sequence[str], configs: Path) -> None:
    """`<group>=null` (`logger=null`): Hydra takes a group's option by name and fails inside its
    own code on null. The fix is named: the group's `none` option where it has one, or `~group`,
    which leaves the group out."""
    for arg in args:
        group, _, value = arg.partition("=")
        if value == "null" and group and group[0] not in "+~" and (configs / group).is_dir():
            none = (
                f"{group}=none runs without one; "
                if (configs / group / "none.yaml").is_file()
                else ""
            )
            raise UserError(
                f"{arg}: a config group takes one of its options by name. {none}~{group} leaves "
                "the group out."
            )
