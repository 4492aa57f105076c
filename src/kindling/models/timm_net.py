"""Any timm model as an image classifier: pretrained weights, its head sized to the data."""

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from kindling.errors import UserError


class TimmClassifier(nn.Module):
    """`timm.create_model(name)` with `num_classes` outputs and `image_shape[0]` input channels.

    With `pretrained=True` timm loads the weights of its pretrained configuration: from the
    Hugging Face hub (cached), or, with `pretrained_file`, from a local file (timm's
    `pretrained_cfg_overlay=dict(file=...)`: a state_dict saved with `torch.save`). timm drops
    a pretrained head whose class count differs and adapts the first convolution to the
    channels. Nets with a fixed input size (ViTs) are built for `image_shape`'s height and
    width; their position embeddings are resampled from the pretrained ones.

    `head` is the classifier layer, the rest is the backbone: `Classifier` gives the backbone
    its own learning rate and can freeze it (`backbone_lr_ratio`, `freeze_backbone_epochs`).
    The other arguments: configs/model/timm.yaml."""

    def __init__(
        self,
        name: str,
        image_shape: Sequence[int],
        num_classes: int,
        pretrained: bool = False,
        pretrained_file: str | None = None,
        drop_rate: float = 0.0,
        drop_path_rate: float | None = None,
        model_args: dict[str, Any] | None = None,
    ):
        super().__init__()
        check_model_name(name)
        kwargs: dict[str, Any] = dict(model_args or {})
        if drop_path_rate is not None:
            kwargs["drop_path_rate"] = drop_path_rate
        if timm.get_pretrained_cfg(name, allow_unregistered=True).fixed_input_size:
            kwargs.setdefault("img_size", tuple(image_shape[1:]))
        if pretrained_file is not None and not Path(pretrained_file).is_file():
            raise UserError(
                f"model.net.pretrained_file={pretrained_file} is not a file. Give a "
                "state_dict saved with torch.save(model.state_dict(), path)."
            )
        pretrained = pretrained or pretrained_file is not None
        try:
            self.model = timm.create_model(
                name,
                pretrained=pretrained,
                num_classes=num_classes,
                in_chans=image_shape[0],
                drop_rate=drop_rate,
                pretrained_cfg_overlay={"file": str(pretrained_file)} if pretrained_file else None,
                **kwargs,
            )
        except OSError as error:  # the hub's errors (no network, no such file) are OSErrors
            if not pretrained:
                raise
            raise UserError(
                f"The pretrained weights of {name} could not be loaded ({type(error).__name__}). "
                "Without network, give a local file: model.net.pretrained_file=<state_dict.pth>."
            ) from error

    @property
    def head(self) -> nn.Module:
        return self.model.get_classifier()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)


def check_model_name(name: str) -> None:
    """Refuse a name timm does not know, naming the closest ones it does."""
    if timm.is_model(name):
        return
    close = difflib.get_close_matches(name, timm.list_models(), n=5, cutoff=0.6)
    hint = f" Close matches: {', '.join(close)}." if close else ""
    raise UserError(
        f"model.net.name={name} is not a timm model.{hint} List them with "
        "python -c \"import timm; print(timm.list_models('*pattern*'))\"."
    )


def pretrained_input(name: str, key: str) -> Any:
    """From timm's pretrained configuration of `name`: `size` (height = width of its input),
    `mean` or `std` (per channel, in [0, 1] units)."""
    check_model_name(name)
    cfg = timm.get_pretrained_cfg(name, allow_unregistered=True)
    if key == "size":
        return int(cfg.input_size[-1])
    return list(getattr(cfg, key))
