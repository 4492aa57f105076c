"""Sample text from a language-model checkpoint, with nothing but the checkpoint file.

    python -m kindling.sample ckpt_path=<file> prompt="The " length=500 temperature=0.8 top_k=40

`prompt` is the text to continue (`\\n` and `\\t` in it are read as newline and tab); `length`
the characters to sample after it; `temperature` 0 always takes the most likely character,
higher is more varied; `top_k` samples among the k most likely characters only (null: all); the
same `seed`, checkpoint and arguments give the same text; `device` is cpu, cuda, cuda:1 or auto
(a GPU when there is one). The checkpoint holds the run's config (which rebuilds the model) and
the vocabulary (in the weights), so neither the corpus nor the configs/ folder is needed.
"""

from dataclasses import dataclass

import torch

from kindling import cli
from kindling.errors import UserError
from kindling.loading import load_module
from kindling.modules.language_model import LanguageModel


@dataclass
class SampleArgs:
    ckpt_path: str  # a checkpoint of `train.py experiment=charlm`
    prompt: str = "\n"
    length: int = 500
    temperature: float = 0.8
    top_k: int | None = None
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        # A newline is awkward to type in a shell: prompt='\\n' gives one.
        self.prompt = self.prompt.replace("\\n", "\n").replace("\\t", "\t")


USAGE = "python -m kindling.sample ckpt_path=<file> [prompt=<text>] [length=500] [top_k=40]"


def sample(args: SampleArgs) -> str:
    """The text `args` asks for: the prompt, then the sampled characters."""
    if args.length < 0 or args.temperature < 0 or (args.top_k is not None and args.top_k < 1):
        raise UserError("length and temperature must be >= 0, and top_k >= 1 (or null).")
    use_instead = "sample from a checkpoint of `python train.py experiment=charlm`."
    module, _ = load_module(args.ckpt_path, LanguageModel, use_instead)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # The one move in kindling outside the Trainer: this command has no Trainer to do it.
    module.to(device)
    return module.sample(args.prompt, args.length, args.temperature, args.top_k, args.seed)


@cli.command(SampleArgs, USAGE)
def main(args: SampleArgs) -> None:
    print(sample(args))


if __name__ == "__main__":
    main()
