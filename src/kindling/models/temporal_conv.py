"""Temporal convolution classifier (FCN): 1-D convolutions over the steps, masked global pooling."""

from collections.abc import Sequence
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from kindling.models.blocks import as_steps, masked_mean, real_steps, step_features


class MaskedBatchNorm(nn.BatchNorm1d):
    """Batch norm of `(B, T, C)` steps whose statistics count real steps only; padding stays 0."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            return super().forward(x.flatten(0, 1)).view_as(x)
        if not self.training and self.running_mean is not None:
            # Running statistics normalise each step alone: every step at once gives the real
            # steps' values without gathering them, a graph of fixed sizes that torch.export and
            # ONNX trace (`x[mask]` has a size that depends on the data).
            normalised = super().forward(x.flatten(0, 1)).view_as(x)
            return normalised.masked_fill(~mask.unsqueeze(-1), 0.0)
        out = torch.zeros_like(x)
        out[mask] = super().forward(x[mask])
        return out


class ConvBlock(nn.Module):
    """Conv1d (zero-padded to keep the length; no bias: the norm has one), batch norm, ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        # What padding="same" does, without its warning about a copy for even kernels.
        self.padding = ((kernel_size - 1) // 2, kernel_size // 2)
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, bias=False)
        self.norm = MaskedBatchNorm(out_channels)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # x is (B, T, C); every block's output is 0 at padding, so a step near a sequence's end
        # sees the zeros it would see alone (the convolution's own padding), never padded data.
        y = self.conv(F.pad(x.transpose(1, 2), self.padding)).transpose(1, 2)
        return torch.relu(self.norm(y, mask))


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
        x = as_steps(inputs)
        mask = real_steps(lengths, x)
        if mask is not None:
            x = x * mask.unsqueeze(-1)  # padding is 0 whatever the batch was padded with
        for block in self.blocks:
            x = block(x, mask)
        return self.head(masked_mean(x, mask))
