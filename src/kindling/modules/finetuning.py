"""Fine-tuning a pretrained net: its backbone and head apart, a lower backbone learning rate,
a backbone frozen for the first epochs."""

from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from kindling.errors import UserError


def backbone_and_head(net: nn.Module) -> tuple[list[nn.Parameter], nn.Module]:
    """The parameters of all but the net's `head` submodule, and the head."""
    head = getattr(net, "head", None)
    if not isinstance(head, nn.Module):
        raise UserError(
            f"{type(net).__name__} has no `head` submodule, so its backbone cannot be told apart: "
            "set model.backbone_lr_ratio=1 and model.freeze_backbone_epochs=0, or give the net "
            "a `head` (its classifier layer)."
        )
    in_head = {id(p) for p in head.parameters()}
    return [p for p in net.parameters() if id(p) not in in_head], head


def parameter_groups(net: nn.Module, backbone_lr_ratio: float) -> list[dict]:
    """Two optimizer parameter groups, named for the learning-rate monitor; the backbone's
    `lr_ratio` scales the optimizer's learning rate (`BaseModule.configure_optimizers`)."""
    if backbone_lr_ratio <= 0:
        raise UserError(
            f"model.backbone_lr_ratio={backbone_lr_ratio} must be above 0; freeze the backbone "
            "with model.freeze_backbone_epochs=<epochs> instead."
        )
    backbone, head = backbone_and_head(net)
    return [
        {"params": backbone, "name": "backbone", "lr_ratio": backbone_lr_ratio},
        {"params": list(head.parameters()), "name": "head"},
    ]


class FrozenBackbone(Callback):
    """For the first `epochs` only the net's head learns. The backbone's gradients are computed
    and dropped (the optimizer skips a parameter without one: no update, no weight decay) rather
    than never asked for (`requires_grad=False`): DDP fixes the parameters it reduces when it
    wraps the model. Its batch norms keep their statistics (eval mode) while it is frozen, then
    train again (Lightning restores each module's mode after validation: an eval mode set once
    would outlast the frozen epochs)."""

    def __init__(self, epochs: int):
        self.epochs = epochs

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        _, head = backbone_and_head(pl_module.net)  # a net without a head is refused in one line
        head_layers = set(head.modules())
        for layer in pl_module.net.modules():
            if isinstance(layer, _BatchNorm) and layer not in head_layers:
                layer.train(trainer.current_epoch >= self.epochs)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.current_epoch < self.epochs:
            for parameter in backbone_and_head(pl_module.net)[0]:
                parameter.grad = None
