"""Transformer encoder image classifier: each image row is a token."""

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from kindling.models.blocks import TransformerBlock, image_to_sequence


class TransformerClassifier(nn.Module):
    """Row tokens, learned positions, pre-norm encoder blocks, class-token or mean pooling.

    Takes images `(B, C, H, W)`, reads them as `H` tokens of `C*W` features, returns
    `(B, num_classes)`.
    """

    def __init__(
        self,
        image_shape: Sequence[int],
        num_classes: int,
        d_model: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        dropout: float = 0.1,
        pooling: Literal["cls", "mean"] = "cls",
    ):
        super().__init__()
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        channels, seq_len, width = image_shape
        self.pooling = pooling
        self.embed = nn.Linear(channels * width, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model)) if pooling == "cls" else None
        num_tokens = seq_len + (1 if pooling == "cls" else 0)
        self.pos_embedding = nn.Parameter(torch.randn(1, num_tokens, d_model) * 0.02)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(TransformerBlock(d_model, num_heads, mlp_ratio, dropout) for _ in range(num_layers))
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(image_to_sequence(images))
        if self.cls_token is not None:
            tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        x = self.norm(self.blocks(self.dropout(tokens + self.pos_embedding)))
        pooled = x[:, 0] if self.pooling == "cls" else x.mean(dim=1)
        return self.head(pooled)
