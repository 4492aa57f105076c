"""Temporal convolution classifier (FCN): 1-D convolutions over the steps, masked global pooling."""

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import nn

from kindling.models.blocks import ConvBlock, as_steps, masked_mean, real_steps, step_features


class TemporalConvClassifier(nn.Module):
    """Wang et al.'s (2017) fully convolutional network: conv blocks (`channels`, `kernel_sizes`),
    average pooling over the real steps, a linear head. Inputs as the RecurrentClassifier's."""

    def __init__(
        self,
        image_shape: Sequence[int] | None,
        num_classes: int,
        channels: Sequence[int] = (128, 256, 128),
        kernel_sizes: Sequence[int] = (8, 5, 3),
        dropout: float = 0.1,
        num_features: int | None = None,
    ):
        super().__init__()
        if len(channels) != len(kernel_sizes):
            raise ValueError(
                f"one kernel size per conv block: channels={list(channels)}, "
                f"kernel_sizes={list(kernel_sizes)}"
            )
        widths = [step_features(image_shape, num_features), *channels]
        self.blocks = nn.ModuleList(
            ConvBlock(c_in, c_out, k)
            for (c_in, c_out), k in zip(pairwise(widths), kernel_sizes, strict=True)
        )
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(widths[-1], num_classes))

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        x, mask = real_steps(lengths, as_steps(inputs))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(masked_mean(x, mask))
