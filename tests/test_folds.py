"""k-fold cross-validation: disjoint, stratified, seeded folds of in-memory sets and folders."""

from collections import Counter
from pathlib import Path

import pytest
import torch

from kindling.config.instantiate import build, check_arguments
from kindling.data.digits import DigitsDataModule
from kindling.data.folds import fold_split
from kindling.errors import UserError

from helpers import datamodule, make_folder

FOLDS = 5


def test_folds_are_disjoint_cover_every_sample_and_keep_the_class_shares() -> None:
    # Unequal classes (40, 23, 7, 3): stratification has something to get wrong.
    labels = torch.tensor([0] * 40 + [1] * 23 + [2] * 7 + [3] * 3)[torch.randperm(73)]
    vals = []
    for fold in range(FOLDS):
        train, val = fold_split(labels, FOLDS, fold, seed=3)
        assert sorted(torch.cat([train, val]).tolist()) == list(range(len(labels)))
        vals.append(set(val.tolist()))
    assert set().union(*vals) == set(range(len(labels)))
    assert sum(len(v) for v in vals) == len(labels)  # no sample in two folds
    for c in range(4):
        counts = [int((labels[sorted(v)] == c).sum()) for v in vals]
        assert max(counts) - min(counts) <= 1, (c, counts)
    # Seeded: the same folds again; another seed deals them differently.
    assert set(fold_split(labels, FOLDS, 0, seed=3)[1].tolist()) == vals[0]
    assert set(fold_split(labels, FOLDS, 0, seed=4)[1].tolist()) != vals[0]


def digit_keys(images: torch.Tensor, dm: DigitsDataModule) -> list[bytes]:
    """Each image as it was on disk (values k/16), undoing the fold's own standardisation."""
    pixels = torch.round((images * dm.std + dm.mean) * 16).to(torch.uint8)
    return [row.numpy().tobytes() for row in pixels]


def test_digits_folds_are_disjoint_validation_sets_covering_the_training_data(
    tmp_path: Path,
) -> None:
    vals, train_and_val, test_labels = Counter(), None, set()
    for fold in range(FOLDS):
        dm = DigitsDataModule(
            str(tmp_path), num_classes=10, image_shape=[1, 8, 8], folds=FOLDS, fold=fold
        )
        dm.setup("fit")
        (train, train_y), (val, val_y) = dm.data_train.tensors, dm.data_val.tensors
        this_fold = Counter(digit_keys(val, dm))
        assert not this_fold & vals, "a validation image was in an earlier fold's validation set"
        vals += this_fold
        everything = Counter(digit_keys(train, dm)) + this_fold
        assert train_and_val in (None, everything)  # each fold splits the same training data
        train_and_val = everything
        assert abs(len(val) - len(train_y) / (FOLDS - 1)) <= 10
        assert set(val_y.tolist()) == set(range(10))
        test_labels.add(tuple(dm.data_test.tensors[1].tolist()))
    assert vals == train_and_val  # the folds cover the training data
    assert len(test_labels) == 1  # the test split is the same for every fold


def test_image_folder_folds_split_what_train_keeps_after_the_test(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=10)
    vals, kept, tests = [], set(), set()
    for fold in range(3):
        dm = datamodule(root, folds=3, fold=fold)
        dm.setup("fit")
        train, val = {f for f, _ in dm.data_train.samples}, {f for f, _ in dm.data_val.samples}
        assert not train & val
        assert {label for _, label in dm.data_val.samples} == {0, 1, 2}
        vals.append(val)
        kept.add(frozenset(train | val))
        tests.add(frozenset(f for f, _ in dm.data_test.samples))
    # Each fold splits the same 27 files; the test split (3 files) is the one carved today.
    (test,), (kept,) = tests, kept
    assert len(test) == 3 and len(kept) == 27 and not kept & test
    assert sum(len(v) for v in vals) == 27 and set().union(*vals) == kept


def test_image_folder_with_a_val_folder_refuses_folds(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=4, splits=("train", "val"))
    with pytest.raises(UserError, match=r"data.folds=2: .*val is a validation split of its own"):
        datamodule(root, folds=2, fold=0).setup("fit")


@pytest.mark.parametrize(
    ("folds", "fold", "message"),
    [
        (5, 5, "data.fold=5 is out of range for data.folds=5: use 0..4."),
        (5, -1, "data.fold=-1 is out of range for data.folds=5: use 0..4."),
        (5, None, "data.folds=5 needs the validation fold: data.fold=0..4"),
        (None, 1, "data.fold=1 needs the number of folds: add data.folds=K"),
        (1, 0, "data.folds=1: cross-validation needs a whole number of folds, >= 2."),
    ],
)
def test_a_fold_setting_that_picks_no_fold_is_refused_in_one_line(
    compose_config, folds, fold, message
) -> None:
    as_yaml = {None: "null"}
    cfg = compose_config(
        "trainer=cpu",
        f"data.folds={as_yaml.get(folds, folds)}",
        f"data.fold={as_yaml.get(fold, fold)}",
    )
    with pytest.raises(UserError, match=message.replace(".", r"\.")) as error:
        build(cfg.data, "data")
    assert "\n" not in str(error.value)


def test_a_data_set_without_folds_refuses_them(compose_config) -> None:
    cfg = compose_config("experiment=charlm", "trainer=cpu", "+data.folds=5")
    message = "data.folds=5: kindling.data.text.CharTextDataModule takes no argument 'folds'"
    with pytest.raises(UserError, match=message):
        check_arguments(cfg.data, "data")
