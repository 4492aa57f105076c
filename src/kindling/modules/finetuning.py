"""Fine-tuning a pretrained net: its backbone and head apart, a lower backbone learning rate,
a backbone frozen for the first epochs."""

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from kindling.errors import UserError


def backbone_and_head(net: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The net's parameters split in two: its `head` submodule's, and all the others'."""
    head = getattr(net, "head", None)
    if not isinstance(head, nn.Module):
        raise UserError(
            f"{type(net).__name__} has no `head` submodule, so its backbone cannot be told apart: "
            "set model.backbone_lr_ratio=1 and model.freeze_backbone_epochs=0, or give the net "
            "a `head` (its classifier layer)."
        )
    in_head = {id(p) for p in head.parameters()}
    backbone = [p for p in net.parameters() if id(p) not in in_head]
    return backbone, list(head.parameters())


def parameter_groups(net: nn.Module, backbone_lr_ratio: float) -> list[dict]:
    """Two optimizer parameter groups, named for the learning-rate monitor; the backbone's
    `lr_ratio` scales the optimizer's learning rate (`optimization.configure_optimizers`)."""
    if backbone_lr_ratio <= 0:
        raise UserError(
            f"model.backbone_lr_ratio={backbone_lr_ratio} must be above 0; freeze the backbone "
            "with model.freeze_backbone_epochs=<epochs> instead."
        )
    backbone, head = backbone_and_head(net)
    return [
        {"params": backbone, "name": "backbone", "lr_ratio": backbone_lr_ratio},
        {"params": head, "name": "head"},
    ]


def hold_backbone(net: nn.Module, frozen: bool) -> None:
    """A frozen backbone's batch norms keep their statistics (eval mode) for this epoch; once
    it learns, they are back in training mode (Lightning restores the modes each module had
    before validation, so an eval mode set here would outlast the frozen epochs)."""
    backbone_and_head(net)  # a net without a head is refused in one line
    head_layers = set(net.head.modules())
    for layer in net.modules():
        if isinstance(layer, _BatchNorm) and layer not in head_layers:
            layer.train(not frozen)


def drop_backbone_gradients(net: nn.Module) -> None:
    """The optimizer skips parameters without a gradient (no update, no weight decay). The
    gradients are computed and dropped rather than never asked for (`requires_grad=False`):
    DDP fixes the parameters it reduces when it wraps the model, so they must stay the same."""
    backbone, _ = backbone_and_head(net)
    for parameter in backbone:
        parameter.grad = None
