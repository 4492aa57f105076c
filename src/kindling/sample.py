"""Sample text from a language-model checkpoint, with nothing but the checkpoint file.

    python -m kindling.sample ckpt_path=<file> prompt="The " length=500 temperature=0.8 top_k=40

Arguments are `key=value`, like train.py's overrides; `python -m kindling.sample --help` lists
them. The checkpoint holds the run's config (which rebuilds the model) and the vocabulary (in the
weights), so neither the corpus nor the configs/ folder is needed.
"""

import dataclasses
import sys

import torch

from kindling import cli
from kindling.config.errors import UserError
from kindling.garbage_collection import skip_collections_at_exit
from kindling.loading import load_module
from kindling.modules.language_model import LanguageModel


def _arg(default: object, help: str) -> dataclasses.Field:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class SampleArgs:
    ckpt_path: str = _arg(dataclasses.MISSING, "a checkpoint of `train.py experiment=charlm`")
    prompt: str = _arg("\n", "the text to continue; \\n and \\t are read as newline and tab")
    length: int = _arg(500, "characters to sample after the prompt")
    temperature: float = _arg(0.8, "0: always the most likely character; higher: more varied")
    top_k: int | None = _arg(None, "sample among the k most likely characters only; null: all")
    seed: int = _arg(0, "the same seed, checkpoint and arguments give the same text")
    device: str = _arg("cpu", "cpu | cuda | cuda:1 | auto (a GPU when there is one)")

    def __post_init__(self) -> None:
        # A newline is awkward to type in a shell: prompt='\\n' gives one.
        self.prompt = self.prompt.replace("\\n", "\n").replace("\\t", "\t")


USAGE = "python -m kindling.sample ckpt_path=<file> [prompt=<text>] [length=500] [top_k=40]"


def load_language_model(ckpt_path: str, device: str = "cpu") -> LanguageModel:
    """The LanguageModel of a kindling checkpoint, in eval mode, on `device`."""
    module, _checkpoint = load_module(ckpt_path)
    if not isinstance(module, LanguageModel):
        raise UserError(
            f"{ckpt_path} holds a {type(module).__name__}, not a LanguageModel: sample from a "
            "checkpoint of `python train.py experiment=charlm`."
        )
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # The one move in kindling outside the Trainer: this script has no Trainer to do it.
    return module.to(device)


def sample(args: SampleArgs) -> str:
    """The text `args` asks for: the prompt, then the sampled characters."""
    if args.length < 0 or args.temperature < 0 or (args.top_k is not None and args.top_k < 1):
        raise UserError("length and temperature must be >= 0, and top_k >= 1 (or null).")
    module = load_language_model(args.ckpt_path, args.device)
    return module.sample(args.prompt, args.length, args.temperature, args.top_k, args.seed)


@cli.main
def main(argv: list[str]) -> None:
    print(sample(cli.parse(SampleArgs, argv, USAGE)))


if __name__ == "__main__":
    skip_collections_at_exit()
    main(sys.argv[1:])
