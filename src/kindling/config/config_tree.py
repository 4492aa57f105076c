"""The resolved config of a run as a tree: saved in its folder when the run starts."""

import logging
from pathlib import Path

import rich.tree
import yaml
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.syntax import Syntax
from rich.text import Text

CONFIG_TREE_FILE = "config_tree.log"
# The groups a reader looks for first; the remaining keys follow in config order.
FIRST = ("data", "model", "callbacks", "logger", "trainer", "paths")

log = logging.getLogger(__name__)


@rank_zero_only
def print_config_tree(
    cfg: DictConfig, save_dir: str | Path | None = None, to_console: bool = False
) -> None:
    """Save the resolved config in `config_tree.log`, one branch per group (its values as YAML),
    one leaf per top-level value (Hydra's `.hydra/config.yaml` keeps the `${...}`); print it with
    `to_console`, else say where."""
    tree = rich.tree.Tree("config", style="bold", guide_style="dim")
    values = OmegaConf.to_container(cfg, resolve=True)
    for key in [k for k in FIRST if k in values] + [k for k in values if k not in FIRST]:
        if isinstance(values[key], dict):
            text = yaml.safe_dump(values[key], sort_keys=False, width=1000).rstrip()
            tree.add(key, style="bold").add(Syntax(text, "yaml", theme="ansi_dark"))
        else:  # one line of YAML (`[dev]`, `null`), as Text: rich would take `[dev]` for markup
            line = yaml.safe_dump(values[key], default_flow_style=True, width=1000)
            tree.add(Text(f"{key}: " + line.removesuffix("...\n").strip()))
    if to_console or save_dir is None:
        Console().print(tree)
    else:
        log.info("Config: %s (print_config=true shows it here)", Path(save_dir) / CONFIG_TREE_FILE)
    if save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(save_dir) / CONFIG_TREE_FILE, "w") as f:
            # No colour codes in the file; wide enough that long values are not wrapped.
            Console(file=f, width=120, color_system=None, force_terminal=False).print(tree)
