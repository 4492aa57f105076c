"""Sample text from a language-model checkpoint, with nothing but the checkpoint file.

    python -m kindling.sample ckpt_path=<file> prompt="The " length=500 temperature=0.8 top_k=40

Arguments are `key=value`, like train.py's overrides; `python -m kindling.sample --help` lists
them. The checkpoint holds the run's config (which rebuilds the model) and the vocabulary (in the
weights), so neither the corpus nor the configs/ folder is needed.
"""

import dataclasses
import logging
import sys
from collections.abc import Sequence

import torch

from kindling.config.errors import UserError
from kindling.garbage_collection import skip_collections_at_exit
from kindling.loading import load_module
from kindling.modules import LanguageModel


def _arg(default: object, help: str) -> dataclasses.Field:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class SampleArgs:
    ckpt_path: str = _arg("", "a checkpoint written by `train.py experiment=charlm`")
    prompt: str = _arg("\n", "the text to continue; \\n and \\t are read as newline and tab")
    length: int = _arg(500, "characters to sample after the prompt")
    temperature: float = _arg(0.8, "0: always the most likely character; higher: more varied")
    top_k: int | None = _arg(None, "sample among the k most likely characters only; null: all")
    seed: int = _arg(0, "the same seed, checkpoint and arguments give the same text")
    device: str = _arg("cpu", "cpu | cuda | cuda:1 | auto (a GPU when there is one)")


def _optional_int(text: str) -> int | None:
    return None if text in ("null", "None", "") else int(text)


def _unescape(text: str) -> str:
    # A newline is awkward to type in a shell: prompt='\n' gives one.
    return text.replace("\\n", "\n").replace("\\t", "\t")


# How each argument is read from its text.
_READERS = {
    "ckpt_path": str,
    "prompt": _unescape,
    "length": int,
    "temperature": float,
    "top_k": _optional_int,
    "seed": int,
    "device": str,
}


def parse_args(argv: Sequence[str]) -> SampleArgs:
    """Read `key=value` arguments into SampleArgs; unknown keys and bad values are UserErrors."""
    values: dict[str, object] = {}
    for arg in argv:
        name, sep, text = arg.partition("=")
        if not sep or name not in _READERS:
            known = ", ".join(_READERS)
            raise UserError(f"Unknown argument {arg!r}. Give key=value with a key among: {known}.")
        try:
            values[name] = _READERS[name](text)
        except ValueError:
            raise UserError(f"{arg!r}: {name} must be a number.") from None
    args = SampleArgs(**values)
    if not args.ckpt_path:
        raise UserError("Give the checkpoint to sample from: ckpt_path=<file>.")
    if args.length < 0 or args.temperature < 0 or (args.top_k is not None and args.top_k < 1):
        raise UserError("length and temperature must be >= 0, and top_k >= 1 (or null).")
    return args


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


def main(argv: Sequence[str]) -> str:
    """Sample as `argv` says and return the text (the prompt, then the sampled characters)."""
    args = parse_args(argv)
    module = load_language_model(args.ckpt_path, args.device)
    return module.sample(args.prompt, args.length, args.temperature, args.top_k, args.seed)


if __name__ == "__main__":
    skip_collections_at_exit()
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        for field in dataclasses.fields(SampleArgs):
            print(f"    {field.name}={field.default!r}  # {field.metadata['help']}")
        sys.exit(0)
    try:
        print(main(sys.argv[1:]))
    except UserError as error:
        logging.basicConfig(format="%(message)s")
        logging.getLogger("kindling").error("%s", error)
        sys.exit(1)
