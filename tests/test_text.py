"""Character-level text data: vocabulary, windows, splits, corpora and downloads, offline.

The download tests serve files from a local HTTP server on 127.0.0.1; nothing else is contacted.
"""

import socket
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch

from kindling.data import text as text_module
from kindling.data.text import CharTextDataModule, TokenWindows, Vocabulary, default_corpus
from kindling.errors import UserError

CORPUS = "It was the best of times, it was the worst of times; ünïcödé ✓ too.\n" * 8


def make_text(tmp_path: Path, text: str = CORPUS, **overrides) -> CharTextDataModule:
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    kwargs = {
        "data_dir": str(tmp_path / "data"),
        "path": str(path),
        "context_length": 8,
        "batch_size": 4,
        "val_fraction": 0.2,
        "test_fraction": 0.1,
    }
    return CharTextDataModule(**{**kwargs, **overrides})


# --------------------------------------------------------------------------------------------
# Vocabulary


def test_vocabulary_round_trip() -> None:
    vocabulary = Vocabulary(CORPUS)
    ids = vocabulary.encode(CORPUS)
    assert ids.dtype == torch.long and ids.shape == (len(CORPUS),)
    assert vocabulary.decode(ids) == CORPUS
    assert len(vocabulary) == len(set(CORPUS))
    # Ids follow the sorted characters, so the same text always gives the same ids.
    assert vocabulary.characters == sorted(set(CORPUS))
    assert vocabulary.decode([0]) == min(CORPUS)


def test_vocabulary_survives_a_tensor_round_trip() -> None:
    vocabulary = Vocabulary(CORPUS)
    restored = Vocabulary.from_tensor(vocabulary.to_tensor())
    assert restored == vocabulary
    assert restored.decode(vocabulary.encode("times ✓")) == "times ✓"


def test_unknown_characters_are_a_user_error() -> None:
    vocabulary = Vocabulary("abc")
    with pytest.raises(UserError, match=r"not in the vocabulary: \['x', 'z'\]"):
        vocabulary.encode("abxz")


# --------------------------------------------------------------------------------------------
# Windows


def test_targets_are_the_inputs_shifted_by_one() -> None:
    tokens = torch.arange(20)
    windows = TokenWindows(tokens, length=6)
    assert len(windows) == 3  # starts 0, 6, 12; the last needs token 18 as its last target
    for index in range(len(windows)):
        inputs, targets = windows[index]
        start = index * 6
        assert inputs.tolist() == list(range(start, start + 6))
        assert targets.tolist() == list(range(start + 1, start + 7))
    with pytest.raises(IndexError):
        windows[3]


def test_strided_windows_start_every_stride_tokens() -> None:
    windows = TokenWindows(torch.arange(20), length=6, stride=1)
    assert len(windows) == 14  # starts 0..13; the last reads token 19 as its last target
    assert windows[13][1].tolist() == list(range(14, 20))


def test_a_window_needs_one_token_past_its_end() -> None:
    assert len(TokenWindows(torch.arange(7), length=6)) == 1
    with pytest.raises(ValueError):
        TokenWindows(torch.arange(6), length=6)


# --------------------------------------------------------------------------------------------
# The data module


def test_splits_follow_the_text_in_order(tmp_path: Path) -> None:
    dm = make_text(tmp_path)
    dm.setup("fit")
    vocabulary = dm.vocabulary
    parts = [
        vocabulary.decode(split.tokens) for split in (dm.data_train, dm.data_val, dm.data_test)
    ]
    assert "".join(parts) == CORPUS
    assert len(parts[1]) == round(len(CORPUS) * 0.2)
    assert len(parts[2]) == round(len(CORPUS) * 0.1)


def test_batches_are_windows_of_the_corpus(tmp_path: Path) -> None:
    dm = make_text(tmp_path)
    dm.setup("fit")
    inputs, targets = next(iter(dm.val_dataloader()))
    assert inputs.shape == targets.shape == (4, 8)
    assert inputs.dtype == targets.dtype == torch.long
    text = dm.vocabulary.decode(inputs[0]) + dm.vocabulary.decode(targets[0][-1:])
    assert text in CORPUS
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def training_starts(dm: CharTextDataModule, epoch: int = 0) -> list[int]:
    """Where each training window of epoch `epoch` starts in the training text."""
    tokens = dm.data_train.tokens.tolist()
    starts = []
    loader = dm.train_dataloader()
    _set_sampler_epoch(loader, epoch)  # as Lightning does at the start of every epoch
    for inputs, _ in loader:
        for window in inputs.tolist():
            starts.append(next(i for i in range(len(tokens)) if tokens[i : i + 8] == window))
    return starts


def test_training_windows_start_at_new_random_places_each_epoch(tmp_path: Path) -> None:
    # Distinct characters: a window's text says where it starts.
    dm = make_text(tmp_path, "".join(chr(0x100 + i) for i in range(400)))
    dm.setup("fit")
    torch.manual_seed(0)
    first, second = training_starts(dm), training_starts(dm)
    assert len(first) == len(second) == (280 - 1) // 8  # one epoch reads the text once
    assert first != second
    assert {s % 8 for s in first + second} != {0}  # not only back-to-back windows
    torch.manual_seed(0)  # seeded by torch's generator, as seed_everything and resume set it
    assert training_starts(dm) == first


def test_without_random_offsets_every_epoch_shuffles_the_same_windows(tmp_path: Path) -> None:
    dm = make_text(tmp_path, "".join(chr(0x100 + i) for i in range(400)), random_offsets=False)
    dm.setup("fit")
    first, second = training_starts(dm, epoch=0), training_starts(dm, epoch=1)
    assert sorted(first) == sorted(second) == list(range(0, 272, 8))
    assert first != second


def test_a_test_fraction_of_0_tests_on_the_validation_text(tmp_path: Path) -> None:
    dm = make_text(tmp_path, val_fraction=0.1, test_fraction=0.0)
    dm.setup("fit")
    assert dm.data_test is dm.data_val
    assert len(dm.data_train.tokens) == len(CORPUS) - round(len(CORPUS) * 0.1)


def test_batches_are_split_over_the_world_size(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # the run's seed, which orders training batches
    dm = make_text(tmp_path, batch_size=4)
    dm.trainer = SimpleNamespace(world_size=2, global_rank=0, accelerator=None)
    dm.setup("fit")
    inputs, _ = next(iter(dm.train_dataloader()))
    assert dm.batch_size_per_device == 2 and inputs.shape[0] == 2


def test_world_size_that_does_not_divide_fails_before_reading(tmp_path: Path) -> None:
    dm = make_text(tmp_path, batch_size=4)
    dm.trainer = SimpleNamespace(world_size=3, accelerator=None)
    dm.load_text = lambda: pytest.fail("setup read the corpus before checking the batch size")
    with pytest.raises(UserError, match="3 processes"):
        dm.setup("fit")


def test_a_folder_is_its_files_in_path_order(tmp_path: Path) -> None:
    folder = tmp_path / "books"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_text("first " * 20, encoding="utf-8")
    (folder / "b" / "c.txt").write_text("second " * 20, encoding="utf-8")
    (folder / ".hidden").write_bytes(b"\xff\xfe not text")  # skipped: hidden
    dm = CharTextDataModule(str(tmp_path), path=str(folder), context_length=4, batch_size=2)
    assert dm.load_text() == "first " * 20 + "\n" + "second " * 20


def test_default_corpus_ships_with_python() -> None:
    text = default_corpus()
    assert len(text) > 300_000
    assert 60 < len(set(text)) < 200
    assert "Assert statements are a convenient way" in text


@pytest.mark.parametrize(
    ("setup_corpus", "problem", "fix"),
    [
        (lambda p: p.write_text("", encoding="utf-8"), "is empty", "data.path"),
        (lambda p: None, "does not exist", "data.path=null"),
        (lambda p: p.write_bytes(b"caf\xe9 latin-1"), "is not UTF-8", "Convert it to UTF-8"),
        (lambda p: p.write_text("too short", encoding="utf-8"), "too few", "data.context_length"),
    ],
)
def test_bad_corpora_are_user_errors(
    tmp_path: Path, setup_corpus: Callable[[Path], None], problem: str, fix: str
) -> None:
    path = tmp_path / "corpus.txt"
    setup_corpus(path)
    dm = CharTextDataModule(str(tmp_path), path=str(path), context_length=8, batch_size=2)
    with pytest.raises(UserError, match=problem) as error:
        dm.setup("fit")
    assert fix in str(error.value)


def test_an_empty_folder_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    dm = CharTextDataModule(str(tmp_path), path=str(tmp_path / "empty"))
    with pytest.raises(UserError, match="folder with no files"):
        dm.setup("fit")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": "a.txt", "download": "tiny_shakespeare"}, "not both"),
        ({"download": "war_and_peace"}, "neither a known corpus"),
        ({"context_length": 0}, "context_length"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"test_fraction": -0.1}, "test_fraction must be 0"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "nothing to train on"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_settings_fail_at_construction(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        CharTextDataModule(str(tmp_path), **kwargs)


# --------------------------------------------------------------------------------------------
# Downloads, from a local HTTP server


def test_download_is_fetched_once_and_cached(tmp_path: Path, serve_folder) -> None:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "input.txt").write_text(CORPUS, encoding="utf-8")
    address, requested = serve_folder(tmp_path / "www")
    data_dir = tmp_path / "data"
    kwargs = {"download": address + "input.txt", "context_length": 8, "batch_size": 2}
    dm = CharTextDataModule(str(data_dir), **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.load_text() == CORPUS
    (cached,) = (data_dir / "text").iterdir()
    assert cached.name.endswith("-input.txt")
    CharTextDataModule(str(data_dir), **kwargs).prepare_data()
    assert requested == ["/input.txt"]  # the second module read the cache


def test_named_corpus_downloads_from_its_address(
    tmp_path: Path, serve_folder, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "shakespeare.txt").write_text("ROMEO:\n" * 50, encoding="utf-8")
    address, requested = serve_folder(tmp_path / "www")
    monkeypatch.setitem(text_module.CORPORA, "tiny_shakespeare", address + "shakespeare.txt")
    dm = CharTextDataModule(str(tmp_path), download="tiny_shakespeare", context_length=4)
    dm.prepare_data()
    assert (tmp_path / "text" / "tiny_shakespeare.txt").read_text() == "ROMEO:\n" * 50
    assert requested == ["/shakespeare.txt"]


def test_failed_download_is_a_user_error_and_leaves_no_file(tmp_path: Path) -> None:
    # A bound socket that never listens: connecting is refused at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/input.txt"
        dm = CharTextDataModule(str(tmp_path), download=url)
        with pytest.raises(UserError, match="Could not download") as error:
            dm.prepare_data()
    assert "data.path" in str(error.value)
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]


def test_missing_download_without_prepare_data_is_a_user_error(tmp_path: Path) -> None:
    dm = CharTextDataModule(str(tmp_path), download="tiny_shakespeare")
    with pytest.raises(UserError, match=r"tiny_shakespeare\.txt is missing"):
        dm.setup("fit")
