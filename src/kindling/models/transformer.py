"""Transformer encoder classifier: image rows, or steps of variable-length sequences, as tokens."""

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from kindling.models.blocks import (
    ConvStem,
    TransformerBlock,
    as_steps,
    masked_mean,
    real_steps,
    step_features,
    steps_per_patch,
)


class TransformerClassifier(nn.Module):
    """Step tokens, learned positions, pre-norm encoder blocks, class-token or mean pooling.
    Inputs as the RecurrentClassifier's (sequences also need `max_length`, the longest it will
    see); no token attends to padding, and mean pooling averages real steps only. Long sequences
    are read in patches of `patch_length` steps, one token each (`blocks.ConvStem`, `d_model`
    features; null: from `max_length`, by `blocks.steps_per_patch`)."""

    def __init__(
        self,
        image_shape: Sequence[int] | None,
        num_classes: int,
        d_model: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        dropout: float = 0.1,
        pooling: Literal["cls", "mean"] = "cls",
        num_features: int | None = None,
        max_length: int | None = None,
        patch_length: int | None = None,
    ):
        super().__init__()
        if pooling not in ("cls", "mean"):  # the Literal hint, for a caller outside the config
            raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        features = step_features(image_shape, num_features)
        if image_shape is not None:
            max_length = image_shape[1]
        elif max_length is None:
            raise ValueError("sequences need max_length: the positions the model learns")
        patch = 1 if image_shape is not None else steps_per_patch(patch_length, max_length)
        # One step a patch: no stem at all (the net without patches, parameter for parameter).
        self.stem = ConvStem(features, d_model, patch) if patch > 1 else None
        max_length = -(-max_length // patch)  # the positions: patches
        self.embed = nn.Linear(d_model if self.stem else features, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model)) if pooling == "cls" else None
        num_tokens = max_length + (1 if pooling == "cls" else 0)
        self.pos_embedding = nn.Parameter(torch.randn(1, num_tokens, d_model) * 0.02)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, num_heads, mlp_ratio, dropout) for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        steps = as_steps(inputs)
        if self.stem is not None:
            steps, lengths = self.stem(steps, lengths)
        steps, mask = real_steps(lengths, steps)
        tokens = self.embed(steps)
        if self.cls_token is not None:
            tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
            if mask is not None:  # the class token is always there
                mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
        x = self.dropout(tokens + self.pos_embedding[:, : tokens.shape[1]])
        for block in self.blocks:
            x = block(x, mask)
        x = self.norm(x)
        pooled = x[:, 0] if self.cls_token is not None else masked_mean(x, mask)
        return self.head(pooled)
