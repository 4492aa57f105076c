"""Character-level text: a vocabulary of characters and fixed-length windows of a corpus."""

import hashlib
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler, TensorDataset

from kindling.data.loaders import SplitDataModule
from kindling.errors import UserError
from kindling.files import write_atomically

# Public-domain corpora that `data.download=<name>` fetches from their canonical address.
CORPORA = {
    # 40,000 lines of Shakespeare, 1.1 MB, from Andrej Karpathy's char-rnn.
    "tiny_shakespeare": (
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
    ),
}
DOWNLOAD_TIMEOUT_S = 60.0


class Vocabulary:
    """The characters of a corpus, each mapped to an id (its index in sorted order)."""

    def __init__(self, characters: Iterable[str]):
        self.characters = sorted(set(characters))
        # Code points in sorted order: encoding is a vectorised binary search.
        self._codepoints = np.array([ord(c) for c in self.characters], dtype=np.int64)

    @classmethod
    def from_tensor(cls, codepoints: torch.Tensor) -> "Vocabulary":
        """The inverse of `to_tensor` (how a checkpoint stores a vocabulary)."""
        return cls(chr(int(c)) for c in codepoints.tolist())

    def to_tensor(self) -> torch.Tensor:
        """The code points as an int64 tensor: it travels in a state_dict and loads weights_only."""
        return torch.from_numpy(self._codepoints.copy())

    def __len__(self) -> int:
        return len(self.characters)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.characters == other.characters

    def encode(self, text: str) -> torch.Tensor:
        missing = sorted(set(text) - set(self.characters))
        if missing:
            raise UserError(
                f"The text has characters that are not in the vocabulary: {missing!r}. "
                f"The vocabulary is {''.join(self.characters)!r}."
            )
        codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        return torch.from_numpy(np.searchsorted(self._codepoints, codepoints))

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        return "".join(self.characters[i] for i in torch.as_tensor(ids).tolist())


class TokenWindows(TensorDataset):
    """Windows of `tokens`, one every `stride` tokens (back to back by default): input
    `tokens[s:s+T]`, target the same window shifted by one (views of `tokens`, not copies)."""

    def __init__(self, tokens: torch.Tensor, length: int, stride: int | None = None):
        if len(tokens) < length + 1:
            raise ValueError(f"{len(tokens)} tokens cannot make a window of {length} + 1")
        windows = tokens.unfold(0, length + 1, stride or length)
        super().__init__(windows[:, :-1], windows[:, 1:])
        self.tokens = tokens

    def identify(self, digest: Any) -> None:  # kindling.data.fingerprint: the text, not windows
        from kindling.data.fingerprint import tensor_bytes

        digest.update(tensor_bytes(self.tokens))


class RandomWindowSampler(Sampler[int]):
    """`RandomSampler`'s draws with replacement, `num_samples` of `num_windows` an epoch, as
    nanoGPT draws its batches, seeded from torch's global generator (`seed_everything` fixes it, a
    resumed run restores it). Not a `RandomSampler` itself, which Lightning would swap for a
    `DistributedSampler` over all windows; this one it wraps.
    """

    def __init__(self, num_windows: int, num_samples: int):
        self.draws = RandomSampler(range(num_windows), replacement=True, num_samples=num_samples)

    def __len__(self) -> int:
        return len(self.draws)

    def __iter__(self) -> Iterator[int]:
        return iter(self.draws)


def default_corpus() -> str:
    """The Python Language Reference as plain text: the topics of `help()`, shipped with Python."""
    from pydoc_data.topics import topics

    return "\n".join(topics[name] for name in sorted(topics))


def read_corpus(path: str | Path) -> str:
    """A UTF-8 file, or every non-hidden file under a folder (in path order), as one string."""
    path = Path(path)
    if not path.exists():
        raise UserError(
            f"data.path={str(path)!r} does not exist. Point it at a UTF-8 text file or a folder "
            "of them (relative paths start from where you run train.py), or set data.path=null "
            "for the default corpus."
        )
    files = [path]
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise UserError(f"data.path={str(path)!r} is a folder with no files. Add text files.")
    texts = []
    for file in files:
        try:
            texts.append(file.read_text(encoding="utf-8"))
        except UnicodeDecodeError as error:
            raise UserError(
                f"{file} is not UTF-8 text ({error.reason} at byte {error.start}). "
                "Convert it to UTF-8, or remove it from the folder."
            ) from error
    return "\n".join(texts)


class CharTextDataModule(SplitDataModule):
    """A character-level corpus split by position into train | val | test, in windows of
    `context_length` characters, targets shifted by one. The vocabulary is the whole corpus's
    characters: no split meets an unknown one. Its arguments: configs/data/text/char.yaml."""

    def __init__(
        self,
        data_dir: str,
        path: str | None = None,
        download: str | None = None,
        context_length: int = 128,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        random_offsets: bool = True,
        num_workers: int = 0,
        pin_memory: bool = True,
        persistent_workers: bool = True,
    ):
        super().__init__()
        self.save_hyperparameters()
        if path is not None and download is not None:
            raise UserError(
                f"Set one of data.path={path!r} and data.download={download!r}, not both."
            )
        self.download: tuple[str, Path] | None = None  # the address to fetch, the file it fills
        if download in CORPORA:
            self.download = CORPORA[download], Path(data_dir) / "text" / f"{download}.txt"
        elif download is not None:
            if urlparse(download).scheme not in ("http", "https"):
                raise UserError(
                    f"data.download={download!r} is neither a known corpus "
                    f"({', '.join(CORPORA)}) nor an http(s) address."
                )
            # A short hash of the address keeps two `input.txt` from different places apart.
            tag = hashlib.sha256(download.encode()).hexdigest()[:12]
            name = Path(urlparse(download).path).name or "corpus.txt"
            self.download = download, Path(data_dir) / "text" / f"{tag}-{name}"
        if context_length < 1:
            raise UserError(f"data.context_length must be at least 1, got {context_length}.")
        if not 0.0 <= test_fraction < 1.0:
            raise UserError(
                f"data.test_fraction must be 0 (test on the validation text) or between 0 and 1, "
                f"got {test_fraction}."
            )
        if val_fraction + test_fraction >= 1.0:
            raise UserError(
                f"data.val_fraction + data.test_fraction = {val_fraction + test_fraction} "
                "leaves nothing to train on; make them smaller."
            )
        self.vocabulary: Vocabulary | None = None

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node, before setup(): the place to download.
        if self.download is None or self.download[1].is_file():
            return
        url, cached = self.download
        try:  # atomically: a failed download leaves no partial file
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                write_atomically(cached, lambda file: shutil.copyfileobj(response, file))
        except (urllib.error.URLError, OSError) as error:
            raise UserError(
                f"Could not download {url} ({error}). Put the file at {cached} yourself, "
                "or train on a local file with data.path=<file>."
            ) from error

    def load_text(self) -> str:
        if self.hparams.path is not None:
            return read_corpus(self.hparams.path)
        if self.download is not None:
            cached = self.download[1]
            if not cached.is_file():
                raise UserError(f"{cached} is missing: call prepare_data() to download it.")
            return read_corpus(cached)
        return default_corpus()

    def setup_splits(self) -> None:
        hp, text = self.hparams, self.load_text()
        if not text:
            raise UserError(
                f"The corpus {hp.path or hp.download!r} is empty. Point data.path at a text file."
            )
        self.vocabulary = Vocabulary(text)
        tokens = self.vocabulary.encode(text)

        # By position, not at random: neighbouring windows share text, so a shuffled split
        # would leak validation text into training.
        num_val = round(len(tokens) * hp.val_fraction)
        num_test = round(len(tokens) * hp.test_fraction)
        num_train = len(tokens) - num_val - num_test
        train, val, test = torch.split(tokens, [num_train, num_val, num_test])
        shortest = min(len(train), len(val), len(test) or len(val))
        length = hp.context_length
        if shortest < length + 1:
            raise UserError(
                f"The corpus has {len(text):,} characters: its smallest split has {shortest:,}, "
                f"too few for one window of data.context_length={length} plus its target. "
                "Use a longer text, a smaller data.context_length, or larger split fractions."
            )
        self.data_train = TokenWindows(train, length, stride=1 if hp.random_offsets else None)
        self.data_val = TokenWindows(val, length)
        self.data_test = TokenWindows(test, length) if num_test else self.data_val

    def train_dataloader(self) -> DataLoader:
        if not self.hparams.random_offsets:
            return super().train_dataloader()
        # As many windows per epoch as fit back to back: an epoch still reads the text once.
        per_epoch = (len(self.data_train.tokens) - 1) // self.hparams.context_length
        return self._loader(
            self.data_train, sampler=RandomWindowSampler(len(self.data_train), per_epoch)
        )
