"""The resolved config of a run as a tree: saved in its folder when the run starts."""

import logging
from collections.abc import Sequence
from pathlib import Path

import rich.tree
import yaml
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, ListConfig, OmegaConf
from rich.console import Console
from rich.syntax import Syntax
from rich.text import Text

CONFIG_TREE_FILE = "config_tree.log"

log = logging.getLogger(__name__)

# The groups a reader looks for first; the remaining keys follow in config order.
FIRST = ("data", "model", "callbacks", "logger", "trainer", "paths")


def config_tree(cfg: DictConfig, first: Sequence[str] = FIRST) -> rich.tree.Tree:
    """One branch per group (its resolved values as YAML), one leaf per top-level value."""
    tree = rich.tree.Tree("config", style="bold", guide_style="dim")
    keys = [k for k in first if k in cfg] + [k for k in cfg if k not in first]
    for key in keys:
        value = cfg[key]
        if isinstance(value, DictConfig):
            text = OmegaConf.to_yaml(value, resolve=True).rstrip()
            tree.add(key, style="bold").add(Syntax(text, "yaml", theme="ansi_dark"))
        else:
            if isinstance(value, ListConfig):
                value = OmegaConf.to_container(value, resolve=True)
            # Text, not markup: rich would take `[dev]` for a style tag and drop it.
            tree.add(Text(f"{key}: {_yaml_line(value)}"))
    return tree


def _yaml_line(value: object) -> str:
    """A value as one line of YAML: `[dev]`, `null`, `true` (not Python's `['dev']`, `None`)."""
    # A bare scalar document ends with a `...` line; drop it.
    return yaml.safe_dump(value, default_flow_style=True, width=1000).replace("\n...\n", "").strip()


@rank_zero_only
def print_config_tree(
    cfg: DictConfig, save_dir: str | Path | None = None, to_console: bool = False
) -> None:
    """Save the resolved config as a tree, `config_tree.log` (rank 0 only); print it with
    `to_console`, else print where it is.

    `.hydra/config.yaml` keeps the config as written (with `${...}`); this file shows the values
    the run actually used.
    """
    tree = config_tree(cfg)
    if to_console or save_dir is None:
        Console().print(tree)
    else:
        log.info("Config: %s (print_config=true shows it here)", Path(save_dir) / CONFIG_TREE_FILE)
    if save_dir is not None:
        path = Path(save_dir) / CONFIG_TREE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            # No colour codes in the file; wide enough that long values are not wrapped.
            Console(file=f, width=120, color_system=None, force_terminal=False).print(tree)
