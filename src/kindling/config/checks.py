"""Checks of the config that fail fast, with a message that names the problem and the fix."""

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kindling.config.errors import UserError


def check_model_fits_data(cfg: DictConfig) -> None:
    """A classifier needs classes: `experiment=charlm model=lstm` names the image classifier's
    LSTM on a text corpus, whose config has no `num_classes` for it to read."""
    if "num_classes" in cfg.data.keys():  # noqa: SIM118 - keys only: nothing is resolved
        return
    if "data.num_classes" not in OmegaConf.to_yaml(cfg.model, resolve=False):
        return
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    model, data = choices.get("model", "<option>"), choices.get("data", "<option>")
    raise UserError(
        f"model={model} is a classifier, and data={data} has no classes. For a language model "
        "use model=lm/<family>: model=lm/rnn, model=lm/lstm or model=lm/transformer."
    )
