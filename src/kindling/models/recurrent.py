"""Recurrent image classifiers: an image is read row by row, one time step per row."""

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from kindling.models.blocks import image_to_sequence


class RecurrentClassifier(nn.Module):
    """A stack of `nn.RNN` / `nn.LSTM` / `nn.GRU` layers and a linear head on the last hidden state.

    Takes images `(B, C, H, W)`, reads them as sequences `(B, H, C*W)`, returns `(B, num_classes)`.
    Subclasses choose the cell.
    """

    cell: ClassVar[type[nn.RNNBase]]

    def __init__(
        self,
        image_shape: Sequence[int],
        num_classes: int,
        hidden_size: int = 128,
        num_layers: int = 2,
        dropout: float = 0.1,
        bidirectional: bool = False,
    ):
        super().__init__()
        channels, _height, width = image_shape
        self.rnn = self.cell(
            channels * width,
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

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _, hidden = self.rnn(image_to_sequence(images))
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
