"""Convolutional image classifier."""

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import nn


def conv_block(in_channels: int, out_channels: int, dropout: float) -> nn.Sequential:
    """Two 3x3 conv + batch norm + ReLU layers, then 2x2 max pooling and dropout."""
    layers: list[nn.Module] = []
    for channels_in in (in_channels, out_channels):
        layers += [
            # No conv bias: the batch norm that follows has its own.
            nn.Conv2d(channels_in, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        ]
    # ceil_mode keeps a 1x1 map at 1x1, so depth is not limited by small images.
    layers += [nn.MaxPool2d(2, ceil_mode=True), nn.Dropout(dropout)]
    return nn.Sequential(*layers)


class CNNClassifier(nn.Module):
    """Conv blocks (one per entry of `channels`), global average pooling, a linear head: images
    `(B, C, H, W)` of any size (`image_shape = (C, H, W)`) to logits `(B, num_classes)`."""

    def __init__(
        self,
        image_shape: Sequence[int],
        num_classes: int,
        channels: Sequence[int] = (32, 64),
        dropout: float = 0.1,
    ):
        super().__init__()
        widths = [image_shape[0], *channels]
        self.features = nn.Sequential(
            *(conv_block(c_in, c_out, dropout) for c_in, c_out in pairwise(widths))
        )
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[-1], num_classes)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))
