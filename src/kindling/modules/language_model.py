"""Language modelling around any net that maps token ids `(B, T)` to logits `(B, T, vocab_size)`."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from kindling.data.text import Vocabulary
from kindling.errors import UserError
from kindling.modules.base import BaseModule

SAMPLES_FILE = "samples.txt"


class LanguageModel(BaseModule):
    """Next-token cross-entropy over every position; logs `<stage>/loss` (per token) and
    `val/ppl`, `test/ppl`. After each validation epoch it samples `sample_length` characters
    after `sample_prompt` (0: none; every rank, FSDP shards gathered; `sample_seed` leaves the
    training random state alone), printed, appended to `samples.txt` and to TensorBoard.

    `net` is a factory taking `vocab_size`, called once the data module's `vocabulary` is known
    (`configure_model`); the vocabulary is a buffer, so a checkpoint's state_dict alone rebuilds
    the net. The optimizer, scheduler and compilation: `BaseModule`'s."""

    def __init__(
        self,
        net: Callable[..., nn.Module],
        sample_prompt: str = "\n",
        sample_length: int = 300,
        sample_temperature: float = 0.8,
        sample_top_k: int | None = None,
        sample_seed: int = 0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.net_factory = net
        self.net: nn.Module | None = None
        # The characters behind the ids, as code points; empty until `build`.
        self.register_buffer("vocabulary_codepoints", torch.empty(0, dtype=torch.long))

    def build(self, vocabulary: Vocabulary) -> None:
        """Create the net for `vocabulary`: its size sets the embedding and output layers."""
        self.net = self.net_factory(vocab_size=len(vocabulary))
        self.vocabulary_codepoints = vocabulary.to_tensor()

    @property
    def vocabulary(self) -> Vocabulary:
        if self.net is None:
            raise RuntimeError("the net is not built yet: call build() or load a checkpoint")
        return Vocabulary.from_tensor(self.vocabulary_codepoints)

    def configure_model(self) -> None:
        # Lightning calls this in every stage after the data module's setup: build once.
        if self.net is None:
            vocabulary = getattr(self.trainer.datamodule, "vocabulary", None)
            if vocabulary is None:
                raise UserError(
                    "LanguageModel takes its vocabulary from the data module, and this one has "
                    "none. Use a text data module (data=text/char, e.g. via experiment=charlm)."
                )
            self.build(vocabulary)
        super().configure_model()

    def load_state_dict(
        self, state_dict: dict[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """Load weights; first build the net from the checkpoint's vocabulary if there is none."""
        if "vocabulary_codepoints" in state_dict:
            saved = Vocabulary.from_tensor(state_dict["vocabulary_codepoints"])
            if self.net is None:
                self.build(saved)
            elif saved != self.vocabulary:
                raise UserError(
                    f"The checkpoint's vocabulary ({len(saved)} characters) is not the data's "
                    f"({len(self.vocabulary)}). Resume or test with the corpus it was trained on."
                )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens)

    def shared_step(self, stage: str, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        tokens, targets = batch  # ids (B, T)
        logits = self(tokens)
        # Each token's loss: the epoch metrics average tokens, not batches.
        losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
        self.epoch_metrics[f"{stage}/loss"].update(losses)
        return {"loss": losses.mean()}

    def log_epoch(self, stage: str, prog_bar: bool = True) -> None:
        # Perplexity is the loss's exp (no second softmax pass). compute() is reduced across
        # processes (and cached until Lightning resets the metric).
        loss = self.epoch_metrics[f"{stage}/loss"].compute()
        if stage != "train":
            self.log(f"{stage}/ppl", loss.exp(), prog_bar=prog_bar, sync_dist=True)
        super().log_epoch(stage, prog_bar)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.hparams.sample_length <= 0:
            return
        # Every rank samples, the same text: under FSDP the weights are gathered from all ranks
        # (a rank sampling alone would wait for the others forever). Rank 0 prints it.
        with FSDP.summon_full_params(self.trainer.strategy.model, writeback=False):
            text = self.sample(
                self.hparams.sample_prompt,
                self.hparams.sample_length,
                self.hparams.sample_temperature,
                self.hparams.sample_top_k,
                self.hparams.sample_seed,
            )
        if not self.trainer.is_global_zero:
            return
        when = "before training" if self.trainer.sanity_checking else f"epoch {self.current_epoch}"
        heading = f"Sample at step {self.global_step} ({when})"
        self.print(f"\n{heading}:\n{text}\n")
        # CSV cannot hold text: every sample also goes to samples.txt in the run folder.
        path = Path(self.trainer.default_root_dir) / SAMPLES_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(f"=== {heading}\n{text}\n\n")
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                # TensorBoard reads text as Markdown: indent it into a code block to keep lines.
                block = "\n".join("    " + line for line in text.split("\n"))
                logger.experiment.add_text("samples", block, self.global_step)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        length: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Sample `length` ids after `prompt_ids` `(B, P)`, `P >= 1`; returns them, `(B, length)`.

        `temperature` divides the logits (0: take the most likely id); `top_k` keeps only the k
        most likely ids. With a seeded `generator` (on the module's device) the result is
        reproducible.
        """
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        was_training = self.training
        self.eval()  # no dropout while sampling
        logits, state = self.net.forward_with_state(prompt_ids.to(self.device))
        new_ids = []
        for step in range(length):
            next_logits = logits[:, -1].float()
            if temperature == 0:
                next_id = next_logits.argmax(dim=-1, keepdim=True)
            else:
                next_logits = next_logits / temperature
                if top_k is not None and top_k < next_logits.shape[-1]:
                    kth_largest = torch.topk(next_logits, top_k).values[:, -1:]
                    next_logits = next_logits.masked_fill(next_logits < kth_largest, -torch.inf)
                probs = F.softmax(next_logits, dim=-1)
                next_id = torch.multinomial(probs, num_samples=1, generator=generator)
            new_ids.append(next_id)
            if step < length - 1:
                logits, state = self.net.forward_with_state(next_id, state)
        self.train(was_training)
        return torch.cat(new_ids, dim=1) if new_ids else prompt_ids.new_empty(len(prompt_ids), 0)

    def sample(
        self,
        prompt: str,
        length: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int = 0,
    ) -> str:
        """`prompt` followed by `length` sampled characters; the same text for the same seed."""
        if not prompt:
            raise UserError("The prompt is empty: give at least one character, e.g. a newline.")
        vocabulary = self.vocabulary
        prompt_ids = torch.as_tensor(vocabulary.encode(prompt), device=self.device)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        new_ids = self.generate(prompt_ids[None], length, temperature, top_k, generator)
        return prompt + vocabulary.decode(new_ids[0])
