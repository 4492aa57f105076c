"""Recurrent classifiers: an image read row by row, or sequences of different lengths."""

from collections.abc import Sequence
from typing import ClassVar, Literal

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from kindling.models.blocks import ConvStem, as_steps, step_features, steps_per_patch


def rnn_layers(
    cell: type[nn.RNNBase], input_size: int, hidden_size: int, num_layers: int, dropout: float,
    bidirectional: bool = False,
) -> nn.RNNBase:  # fmt: skip
    """`num_layers` batch-first layers of `cell`, `dropout` between them."""
    # nn.RNNBase applies dropout between layers only, and warns when there is one layer.
    dropout = dropout if num_layers > 1 else 0.0
    return cell(input_size, hidden_size, num_layers, batch_first=True, dropout=dropout,
                bidirectional=bidirectional)  # fmt: skip


class RecurrentClassifier(nn.Module):
    """`nn.RNN` / `nn.LSTM` / `nn.GRU` layers (the subclass's `cell`), a linear head on the last
    hidden state: images `(B, C, H, W)` read row by row (give `image_shape`), or padded sequences
    `(B, T, F)` and `lengths` (give `num_features`, packed: padding never enters the recurrence),
    to `(B, num_classes)`. Long sequences are read in patches of `patch_length` steps, one
    recurrent step each (`blocks.ConvStem`, `stem_width` features; null: from `longest_sequence`,
    the data's longest, by `blocks.steps_per_patch`; a longer one is read too, in more patches).
    `pooling`: what the head reads, `last` (the last layer's hidden state after each direction's
    last step) or `max` (each feature's largest value over the last layer's outputs at every real
    step: no evidence has to survive the whole recurrence)."""

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
        longest_sequence: int | None = None,
        patch_length: int | None = None,
        stem_width: int = 64,
        pooling: Literal["last", "max"] = "last",
    ):
        super().__init__()
        if pooling not in ("last", "max"):  # the Literal hint, for a caller outside the config
            raise ValueError(f"pooling must be 'last' or 'max', got {pooling!r}")
        self.pooling = pooling
        features = step_features(image_shape, num_features)
        patch = steps_per_patch(patch_length, None if image_shape else longest_sequence)
        # One step a patch: no stem at all (the net without patches, parameter for parameter).
        self.stem = ConvStem(features, stem_width, patch) if patch > 1 else None
        features = stem_width if self.stem else features
        self.rnn = rnn_layers(self.cell, features, hidden_size, num_layers, dropout, bidirectional)
        directions = 2 if bidirectional else 1
        self.head = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(directions * hidden_size, num_classes)
        )

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        steps = as_steps(inputs)
        if self.stem is not None:
            steps, lengths = self.stem(steps, lengths)
        if lengths is not None:
            # pack_padded_sequence takes the lengths on the CPU; h_n comes back in batch order.
            steps = pack_padded_sequence(
                steps, lengths.cpu(), batch_first=True, enforce_sorted=False
            )
        outputs, hidden = self.rnn(steps)
        if self.pooling == "max":
            if lengths is not None:  # padding is never any sequence's largest value
                outputs, _ = pad_packed_sequence(
                    outputs, batch_first=True, padding_value=-torch.inf
                )
            return self.head(outputs.amax(dim=1))
        if isinstance(hidden, tuple):  # LSTM returns (h_n, c_n)
            hidden = hidden[0]
        # h_n is (layers * directions, B, hidden): keep the last layer, both directions.
        directions = 2 if self.rnn.bidirectional else 1
        last_layer = hidden[-directions:].transpose(0, 1).flatten(1)
        return self.head(last_layer)

    def exportable(self) -> "UnpackedRecurrent":
        """The same function of padded sequences and lengths without packing, which neither
        torch.export nor the ONNX exporter traces: a net that shares this one's weights."""
        return UnpackedRecurrent(self)


class UnpackedRecurrent(nn.Module):
    """A `RecurrentClassifier` on padded sequences and `lengths` without packing: the same logits
    in a graph that torch.export and ONNX trace with a dynamic length. Eval only.

    Each layer and direction runs over the padded length in a `torch.while_loop` (`nn.RNN`'s own
    kernels unroll the steps when traced, fixing the length); each sequence's last real step is
    read by index. Padding comes after each end, so forward states at real steps never see it;
    the backward direction reads each sequence reversed within its length, and its outputs are
    put back in order for the next layer.
    """

    def __init__(self, net: RecurrentClassifier):
        super().__init__()
        self.net = net  # its weights and head, shared

    def forward(self, steps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        rnn = self.net.rnn
        if self.net.stem is not None:
            steps, lengths = self.net.stem(steps, lengths)
        batch, length, _ = steps.shape
        positions = torch.arange(length, device=steps.device).expand(batch, length)
        ends = lengths.to(steps.device).view(batch, 1)
        # Position t of a sequence reversed within its length; padding keeps its place.
        reverse = torch.where(positions < ends, ends - 1 - positions, positions).unsqueeze(-1)
        last = (ends - 1).clamp_min(0).unsqueeze(-1)  # (B, 1, 1): each last real step
        directions = 2 if rnn.bidirectional else 1
        x = steps
        for layer in range(rnn.num_layers):
            outputs, finals = [], []
            for backward in range(directions):
                inputs = x.gather(1, reverse.expand(-1, -1, x.shape[-1])) if backward else x
                weights = rnn.all_weights[layer * directions + backward]
                out = _recurrence(rnn.mode, inputs, *weights)
                index = last.expand(-1, -1, out.shape[-1])
                # The backward state after reading back to the first step: reversed, the last.
                finals.append(out.gather(1, index))
                outputs.append(out.gather(1, reverse.expand_as(out)) if backward else out)
            x = torch.cat(outputs, dim=-1)
        if self.net.pooling == "max":
            # Outputs at padding are left out, as `forward` leaves them.
            x = x.masked_fill(positions.unsqueeze(-1) >= ends.unsqueeze(-1), -torch.inf)
            return self.net.head(x.amax(dim=1))
        return self.net.head(torch.cat(finals, dim=-1).squeeze(1))


def _recurrence(mode: str, inputs: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
    """One layer and direction of an `nn.RNNBase` of `mode` over `inputs` `(B, T, F)` from zero
    states, with its weights (`weight_ih, weight_hh`, biases): the hidden state after each step,
    `(B, T, hidden)`. torch.while_loop traces its body, and not nn.RNN modules: plain values."""
    batch, length, _ = inputs.shape
    zeros = inputs.new_zeros(batch, weights[1].shape[1])
    # The LSTM carries its cell state too (a loop may not return an input unchanged).
    states = (zeros, zeros.clone()) if mode == "LSTM" else (zeros,)

    def more(step: torch.Tensor, outputs: torch.Tensor, *states: torch.Tensor) -> torch.Tensor:
        return step < length

    def advance(step: torch.Tensor, outputs: torch.Tensor, *states: torch.Tensor) -> tuple:
        at = step.view(1)
        x = inputs.index_select(1, at).squeeze(1)
        new = CELLS[mode](x, states if mode == "LSTM" else states[0], *weights)
        states = new if mode == "LSTM" else (new,)
        return step + 1, outputs.index_copy(1, at, states[0].unsqueeze(1)), *states

    start = torch.zeros((), dtype=torch.long, device=inputs.device)
    outputs = zeros.new_zeros(batch, length, zeros.shape[1])
    _, outputs, *_ = torch.while_loop(more, advance, (start, outputs, *states))
    return outputs


# One step of each `mode` of nn.RNNBase, as it computes it.
CELLS = {"LSTM": torch.lstm_cell, "GRU": torch.gru_cell, "RNN_TANH": torch.rnn_tanh_cell,
         "RNN_RELU": torch.rnn_relu_cell}  # fmt: skip


class RNNClassifier(RecurrentClassifier):
    cell = nn.RNN


class LSTMClassifier(RecurrentClassifier):
    cell = nn.LSTM


class GRUClassifier(RecurrentClassifier):
    cell = nn.GRU
