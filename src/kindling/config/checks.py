"""Checks of the config that fail fast, with a message that names the problem and the fix."""

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from kindling.config.errors import UserError


def check_model_fits_data(cfg: DictConfig) -> None:
    """A classifier needs classes: `experiment=charlm model=lstm` names the image classifier's
    LSTM on a text corpus, which has no `num_classes` to give it."""
    if "num_classes" not in cfg.model or "num_classes" in cfg.data:
        return
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    model, data = choices.get("model", "<option>"), choices.get("data", "<option>")
    raise UserError(
        f"model={model} is a classifier, and data={data} has no classes. For a language model "
        "use model=lm/<family>: model=lm/rnn, model=lm/lstm or model=lm/transformer."
    )
