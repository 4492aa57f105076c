"""Recurrent classifiers: an image read row by row, or sequences of different lengths."""

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from kindling.models.blocks import as_steps, step_features


class RecurrentClassifier(nn.Module):
    """A stack of `nn.RNN` / `nn.LSTM` / `nn.GRU` layers and a linear head on the last hidden state.

    Takes images `(B, C, H, W)` (read as sequences `(B, H, C*W)`; give `image_shape`) or padded
    sequences `(B, T, F)` with their `lengths` (give `num_features`); returns `(B, num_classes)`.
    Sequences are packed, so the last hidden state is each one's last real step (and, when
    bidirectional, the backward direction's state after reading back to its first step): padding
    never enters the recurrence. Subclasses choose the cell.
    """

    cell: ClassVar[type[nn.RNNBase]]

    def __init__(
        self,
        image_shape: Sequence[int] | None,
        num_classes: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        dropout: float = 0.1,
        bidirectional: bool = False,
        num_features: int | None = None,
    ):
        super().__init__()
        self.rnn = self.cell(
            step_features(image_shape, num_features),
            hidden_size,
            num_layers=num_layers,
            # nn.RNNBase applies dropout between layers only, and warns when there is one layer.
            dropout=dropout if num_layers > 1 else 0.0,
            bidirectional=bidirectional,
            batch_first=True,
        )
        directions = 2 if bidirectional else 1
        self.head = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(directions * hidden_size, num_classes)
        )

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        steps = as_steps(inputs)
        if lengths is not None:
            # pack_padded_sequence takes the lengths on the CPU; h_n comes back in batch order.
            steps = pack_padded_sequence(
                steps, lengths.cpu(), batch_first=True, enforce_sorted=False
            )
        _, hidden = self.rnn(steps)
        if isinstance(hidden, tuple):  # LSTM returns (h_n, c_n)
            hidden = hidden[0]
        # h_n is (layers * directions, B, hidden): keep the last layer, both directions.
        directions = 2 if self.rnn.bidirectional else 1
        last_layer = hidden[-directions:].transpose(0, 1).flatten(1)
        return self.head(last_layer)


class RNNClassifier(RecurrentClassifier):
    cell = nn.RNN


class LSTMClassifier(RecurrentClassifier):
    cell = nn.LSTM


class GRUClassifier(RecurrentClassifier):
    cell = nn.GRU
