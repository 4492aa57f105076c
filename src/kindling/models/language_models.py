"""Language models: token ids `(B, T)` -> next-token logits `(B, T, vocab_size)`.

Besides `forward`, each model has `forward_with_state(tokens, state)`, which also returns what it
needs to go on from where `tokens` ended: sampling then feeds one new token per step instead of
the whole text again.
"""

from typing import Any, ClassVar

import torch
from torch import nn

from kindling.models.blocks import TransformerBlock
from kindling.models.recurrent import rnn_layers

State = Any  # what forward_with_state hands back to itself; opaque to callers


class RecurrentLanguageModel(nn.Module):
    """Token embedding, a stack of `nn.RNN` / `nn.LSTM` / `nn.GRU` layers, a linear head.

    The hidden state runs through a window (a training sample) and starts from zero at the next.
    Subclasses choose the cell.
    """

    cell: ClassVar[type[nn.RNNBase]]

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int = 64,
        hidden_size: int = 256,
        num_layers: int = 2,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.rnn = rnn_layers(self.cell, embedding_dim, hidden_size, num_layers, dropout)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.forward_with_state(tokens)[0]

    def forward_with_state(
        self, tokens: torch.Tensor, state: State = None
    ) -> tuple[torch.Tensor, State]:
        """Logits for `tokens` `(B, T)` after `state` (the hidden state; None: zeros)."""
        outputs, state = self.rnn(self.dropout(self.embedding(tokens)), state)
        return self.head(self.dropout(outputs)), state


class RNNLanguageModel(RecurrentLanguageModel):
    cell = nn.RNN


class LSTMLanguageModel(RecurrentLanguageModel):
    cell = nn.LSTM


class GRULanguageModel(RecurrentLanguageModel):
    cell = nn.GRU


class TransformerLanguageModel(nn.Module):
    """Decoder-only Transformer: token and learned position embeddings (`context_length` of
    them), causal pre-norm blocks, a final LayerNorm, an output head tied to the token embedding.
    From a CPU test size to GPT-2-small's body (`d_model=768, num_layers=12, num_heads=12`,
    about 86M parameters with a context of 1,024). `dropout`: on embeddings, attention weights
    and residual branches."""

    def __init__(
        self,
        vocab_size: int,
        context_length: int = 128,
        d_model: int = 128,
        num_layers: int = 4,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.1,
    ):
        super().__init__()
        self.context_length = context_length
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(context_length, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(
                TransformerBlock(d_model, num_heads, mlp_ratio, dropout, causal=True)
                for _ in range(num_layers)
            )
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(_init_weights)
        # Tied after the init: one matrix reads tokens in and scores them out (fewer parameters,
        # and every output row is trained by the input side too).
        self.head.weight = self.token_embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.context_length:
            raise ValueError(
                f"{length} tokens exceed the context_length of {self.context_length} positions"
            )
        positions = torch.arange(length, device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        return self.head(self.norm(self.blocks(x)))

    def forward_with_state(
        self, tokens: torch.Tensor, state: State = None
    ) -> tuple[torch.Tensor, State]:
        """Logits for the last `min(T, context_length)` of `tokens` `(B, T)` after `state`.

        The state is the text so far, cropped to what the next call can still attend to. Each
        call recomputes the whole context (no key/value cache): simple, and fast enough for
        sampling a few hundred characters.
        """
        context = tokens if state is None else torch.cat([state, tokens], dim=1)
        context = context[:, -self.context_length :]
        logits = self(context)[:, -tokens.shape[1] :]
        # Keep room for at least one new token in the next call.
        keep = self.context_length - 1
        return logits, context[:, max(0, context.shape[1] - keep) :]

    def num_parameters(self) -> int:
        """Parameters, the tied matrix counted once, the position table not at all (as nanoGPT)."""
        total = sum(p.numel() for p in self.parameters())
        return total - self.position_embedding.weight.numel()

    def training_flops(self, batch_size: int, length: int) -> int:
        """Floating-point operations of one training step (forward and backward) on a batch.

        6 per parameter per token for the matrix multiplies, plus 12 * layers * d_model * length
        per token for attention scores and weighted values (Kaplan et al. 2020; PaLM, appendix B).
        Divide by step time and the accelerator's peak FLOP/s for the model FLOPs utilisation.
        """
        tokens = batch_size * length
        attention = 12 * len(self.blocks) * self.token_embedding.embedding_dim * length
        return tokens * (6 * self.num_parameters() + attention)


def _init_weights(module: nn.Module) -> None:
    # Small normal weights (GPT-2): with a tied head, PyTorch's default N(0, 1) embedding would
    # start the logits at a scale of sqrt(d_model) and the loss far above log(vocab_size).
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
