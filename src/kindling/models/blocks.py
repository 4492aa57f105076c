"""Building blocks shared by the models."""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def as_steps(inputs: torch.Tensor) -> torch.Tensor:
    """Images `(B, C, H, W)` as sequences `(B, H, C*W)`, one step per row; sequences `(B, T, F)`
    as they are."""
    if inputs.dim() != 4:
        return inputs
    batch, channels, height, width = inputs.shape
    return inputs.permute(0, 2, 1, 3).reshape(batch, height, channels * width)


def step_features(image_shape: Sequence[int] | None, num_features: int | None) -> int:
    """Features per time step: `C*W` of an image's rows, or a sequence's `num_features`."""
    if (image_shape is None) == (num_features is None):
        raise ValueError(
            "give image_shape (images, read row by row) or num_features (sequences), not both"
        )
    if image_shape is not None:
        channels, _height, width = image_shape
        return channels * width
    return num_features


def real_steps(
    lengths: torch.Tensor | None, steps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`steps` with padding set to 0 (whatever the batch was padded with), and a `(B, T)` mask,
    True at each sequence's real steps; without lengths, `steps` and None."""
    if lengths is None:
        return steps, None
    mask = torch.arange(steps.shape[1], device=steps.device) < lengths.to(steps.device)[:, None]
    return steps * mask.unsqueeze(-1), mask


# The most steps a default patch leaves of the longest sequence: a recurrence or attention over
# hundreds of steps learned little from a few dozen sequences (BENCHMARKS.md, "Six archive sets").
PATCHED_STEPS = 64


def steps_per_patch(patch: int | None, max_length: int | None) -> int:
    """The steps of one patch: `patch` where given; else the fewest that leave the longest
    sequence, `max_length` steps, at most `PATCHED_STEPS` (1, no patches: short sequences,
    images, or an unknown length)."""
    if patch is not None:
        if patch < 1:
            raise ValueError(f"patch_length must be at least 1, got {patch}")
        return patch
    return 1 if max_length is None else -(-max_length // PATCHED_STEPS)


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of `x` `(B, T, D)` over the real steps of each sequence: `(B, D)`."""
    if mask is None:
        return x.mean(dim=1)
    weights = mask.unsqueeze(-1).to(x.dtype)
    return (x * weights).sum(dim=1) / weights.sum(dim=1)


class MaskedBatchNorm(nn.BatchNorm1d):
    """Batch norm of `(B, T, C)` steps whose statistics count real steps only; padding stays 0."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None or (not self.training and self.running_mean is not None):
            # Running statistics normalise each step alone: every step at once gives the real
            # steps' values without gathering them, a graph of fixed sizes that torch.export and
            # ONNX trace (`x[mask]` has a size that depends on the data).
            normalised = super().forward(x.flatten(0, 1)).view_as(x)
            return normalised if mask is None else normalised.masked_fill(~mask.unsqueeze(-1), 0)
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


class ConvStem(nn.Module):
    """A long sequence in patches of `patch` steps: a conv block over every step (kernel 8, the
    FCN's first), then the most of each patch's `width` features, one step a patch, as CNN-LSTM
    nets read a signal. `(B, T, F)` and `lengths` to `(B, ceil(T / patch), width)` and each
    length in patches; a last patch reads its sequence's real steps alone."""

    def __init__(self, features: int, width: int, patch: int, kernel_size: int = 8):
        super().__init__()
        self.patch = patch
        self.block = ConvBlock(features, width, kernel_size)

    def forward(
        self, steps: torch.Tensor, lengths: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        steps, mask = real_steps(lengths, steps)
        # After the ReLU every real step is >= 0 and padding 0: a part-padded patch's maximum
        # is its real steps'.
        # Zero-padded to whole patches and reshaped, not max_pool1d's ceil_mode: torch.export
        # keeps the length dynamic through this (kindling.export).
        features = self.block(steps, mask)
        features = F.pad(features, (0, 0, 0, -features.shape[1] % self.patch))
        pooled = features.unflatten(1, (-1, self.patch)).amax(dim=2)
        return pooled, None if lengths is None else -(-lengths // self.patch)


class SelfAttention(nn.Module):
    """Multi-head self-attention on `scaled_dot_product_attention` (fused attention kernels)."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, causal: bool = False):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.causal = causal
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.proj_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        """`keys`: `(B, L)` True where a token may be attended to (padding is not)."""
        batch, length, width = x.shape
        # (B, L, 3, heads, head_dim) -> three tensors of (B, heads, L, head_dim)
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        mask = None if keys is None else keys[:, None, None, :]  # every head, every query
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=self.causal,
        )
        y = y.transpose(1, 2).reshape(batch, length, width)
        return self.proj_dropout(self.proj(y))


class TransformerBlock(nn.Module):
    """Pre-norm Transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        causal: bool = False,
    ):
        super().__init__()
        hidden = int(d_model * mlp_ratio)
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, num_heads, dropout, causal)
        self.mlp_norm = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, hidden),
            nn.GELU(),
            nn.Linear(hidden, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), keys)
        return x + self.mlp(self.mlp_norm(x))
