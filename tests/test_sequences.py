"""data=sequences: long tables of variable-length sequences, and every family that reads them."""

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from kindling.data.sequences import SequenceTableDataModule
from kindling.errors import UserError
from kindling.models.recurrent import GRUClassifier, LSTMClassifier, RNNClassifier
from kindling.models.temporal_conv import TemporalConvClassifier
from kindling.models.transformer import TransformerClassifier
from kindling.train import run

from helpers import CLASSES, ON_GPU, QUIET, data_module, in_folder, pattern_rows, write_table


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_shuffled_table_becomes_sequences_in_time_order(tmp_path: Path, suffix: str) -> None:
    rows = pattern_rows(60, seed=0)
    module = data_module(write_table(rows, tmp_path / f"table{suffix}"))
    assert module.classes == list(CLASSES)
    assert module.features == ["x", "y", "z"]
    splits = (module.data_train, module.data_val, module.data_test)
    assert [len(split) for split in splits] == [43, 5, 12]  # test a fifth, val a tenth, stratified
    # Every sequence once, with its own steps in time order (standardised back to the table's).
    by_id: dict[str, list[dict]] = {}
    for row in rows:
        by_id.setdefault(row["id"], []).append(row)
    table_sequences = {
        (tuple(round(r["x"], 4) for r in sorted(steps, key=lambda r: r["time"])), steps[0]["label"])
        for steps in by_id.values()
    }
    found = set()
    for split in splits:
        for steps, label in split:
            x = steps[:, 0] * module.std[0] + module.mean[0]
            found.add((tuple(round(v, 4) for v in x.tolist()), CLASSES[int(label)]))
    assert found == table_sequences

    steps, lengths, labels = next(iter(module.train_dataloader()))
    assert steps.shape == (43, int(lengths.max()), 3)  # one batch of 64 holds all
    assert labels.dtype == torch.long
    for steps_of_one, length in zip(steps, lengths, strict=True):
        assert steps_of_one[length:].abs().sum() == 0  # zero padding after each end


def with_splits(rows: list[dict]) -> list[dict]:
    """Every fifth sequence test, every fifth from the second val, the others train."""
    names = ("test", "val", "train", "train", "train")
    return [{**row, "split": names[int(row["id"][1:]) % 5]} for row in rows]


def test_statistics_come_from_the_training_split_alone(tmp_path: Path) -> None:
    rows = with_splits(pattern_rows(30, seed=1))
    for row in rows:  # val and test far off: statistics that include them are far off too
        if row["split"] != "train":
            row["z"] *= 10
    module = data_module(write_table(rows, tmp_path / "table.csv"))
    assert [len(s) for s in (module.data_train, module.data_val, module.data_test)] == [18, 6, 6]
    train_z = [row["z"] for row in rows if row["split"] == "train"]
    assert module.mean[2] == pytest.approx(np.mean(train_z), rel=1e-5)
    assert module.std[2] == pytest.approx(np.std(train_z, ddof=1), rel=1e-4)
    train_steps = torch.cat([steps for steps, _ in module.data_train])
    assert train_steps.mean(dim=0).abs().max() < 1e-5
    # Saved with the checkpoint, loaded into a module that never saw the table.
    restored = SequenceTableDataModule(str(tmp_path / "table.csv"), 3, 3)
    restored.load_state_dict(module.state_dict())
    assert torch.equal(restored.mean, module.mean)
    assert restored.classes == list(CLASSES)
    # Loaded after setup on another table (as Lightning does when testing a checkpoint): the
    # checkpoint's statistics, not the other table's, standardise what is served.
    other = data_module(write_table(pattern_rows(30, seed=5), tmp_path / "other.csv"))
    raw = other.data_test.sequences[0]
    other.load_state_dict(module.state_dict())
    steps, _ = other.data_test[0]
    torch.testing.assert_close(steps, (raw - module.mean) / module.std)


FEATURES = 3
FAMILIES = {
    "rnn": lambda: RNNClassifier(None, 4, hidden_size=16, num_features=FEATURES),
    "rnn_max": lambda: RNNClassifier(
        None, 4, hidden_size=16, num_features=FEATURES, bidirectional=True, pooling="max"
    ),
    "lstm": lambda: LSTMClassifier(None, 4, hidden_size=16, num_features=FEATURES),
    "gru_bidirectional": lambda: GRUClassifier(
        None, 4, hidden_size=16, num_features=FEATURES, bidirectional=True
    ),
    "transformer_cls": lambda: TransformerClassifier(
        None, 4, d_model=16, num_features=FEATURES, max_length=30
    ),
    "transformer_mean": lambda: TransformerClassifier(
        None, 4, d_model=16, num_features=FEATURES, max_length=30, pooling="mean"
    ),
    # Patches of 4 steps: a length that is no multiple of 4 ends in a part-padded patch.
    "gru_patches": lambda: GRUClassifier(
        None, 4, hidden_size=16, num_features=FEATURES, bidirectional=True, patch_length=4
    ),
    "transformer_patches": lambda: TransformerClassifier(
        None, 4, d_model=16, num_features=FEATURES, max_length=30, patch_length=4
    ),
    "temporal_conv": lambda: TemporalConvClassifier(
        None, 4, channels=[8, 16], kernel_sizes=[8, 5], num_features=FEATURES
    ),
}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_GPU)])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_do_not_depend_on_padding(family: str, device: str) -> None:
    """A sequence alone, and inside a batch padded to three times its length (with noise, not
    zeros, where the padding is), gives the same logits."""
    # In float64 on both: TF32, which a GPU may use for float32, would differ by more than
    # padding may.
    torch.manual_seed(0)
    net = FAMILIES[family]().to(device, torch.float64)
    settings = {"device": device, "dtype": torch.float64}
    net.train()  # batch norm's running statistics: real steps of a padded batch only
    net(torch.randn(4, 30, FEATURES, **settings), torch.tensor([30, 10, 5, 1], device=device))
    net.eval()
    sequence = torch.randn(1, 10, FEATURES, **settings)
    batch = torch.randn(3, 30, FEATURES, **settings)
    batch[1, :10] = sequence[0]
    with torch.no_grad():
        alone = net(sequence, torch.tensor([10], device=device))
        padded = net(batch, torch.tensor([30, 10, 20], device=device))[1:2]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["lstm", "transformer_cls", "temporal_conv"])
def test_images_still_read_row_by_row(family: str) -> None:
    image_nets = {
        "lstm": LSTMClassifier((1, 8, 8), 10),
        "transformer_cls": TransformerClassifier((1, 8, 8), 10),
        "temporal_conv": TemporalConvClassifier((1, 8, 8), 10),
    }
    assert image_nets[family](torch.randn(2, 1, 8, 8)).shape == (2, 10)


# Small nets and few epochs: each run takes a few seconds on two cores.
SMALL = {
    "rnn": ["model.net.hidden_size=32", "model.net.bidirectional=true"],
    "lstm": ["model.net.hidden_size=32"],
    "gru": ["model.net.hidden_size=32", "model.net.bidirectional=true", "data.bucket=true"],
    "transformer": ["model.net.d_model=32", "model.net.pooling=mean"],
    "temporal_conv": ["model.net.channels=[16,32]", "model.net.kernel_sizes=[5,3]"],
}
# On the CPU every family tests at 1.0 after 8 epochs (the LSTM and GRU at 0.93-0.97 after 6);
# cuDNN's packed LSTM keeps the 12 it was checked with.
EPOCHS = {"cpu": 8, "gpu": 12}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "trainer"), [*((model, "cpu") for model in SMALL),
                           pytest.param("lstm", "gpu", marks=ON_GPU)]  # packed by cuDNN
)  # fmt: skip
def test_every_family_learns_where_a_pattern_lies(
    compose_config, tmp_path: Path, model: str, trainer: str
) -> None:
    """The class is a bump at a random step of a sequence 5 to 50 steps long: chance is 1/3."""
    table = write_table(pattern_rows(150, seed=0), tmp_path / "table.parquet")
    cfg = compose_config(
        "data=sequences", f"data.path={table}", "data.batch_size=16", f"model={model}",
        "data.min_epoch_size=0",
        *SMALL[model], "model.optimizer.lr=0.003", f"trainer={trainer}",
        f"trainer.max_epochs={EPOCHS[trainer]}", "callbacks.plots=null", *QUIET,
    )  # fmt: skip
    run(cfg)  # reads the feature and class counts from the table into the config
    assert cfg.model.net.num_features == 3 and cfg.model.num_classes == 3
    with open(Path(cfg.paths.output_dir) / "csv" / "metrics.csv") as f:
        (tested,) = [row for row in csv.DictReader(f) if row.get("test/acc")]
    assert float(tested["test/acc"]) >= 0.9


def small_rows() -> list[dict]:
    """Nine sequences of three classes, ten steps each, in file order."""
    return [row for row in pattern_rows(9, seed=2, lengths=(10, 10))]


def refused(rows: list[dict], tmp_path: Path, suffix: str = ".csv", **options) -> str:
    with pytest.raises(UserError) as error:
        data_module(write_table(rows, tmp_path / f"table{suffix}"), **options)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_sequence_whose_rows_disagree_on_its_label(tmp_path: Path) -> None:
    rows = sorted(small_rows(), key=lambda row: (row["id"], row["time"]))
    rows[4]["label"] = "up" if rows[4]["label"] != "up" else "down"
    message = refused(rows, tmp_path)
    assert "sequence 's0' has rows with labels" in message and "(rows 1 and 5)" in message


@pytest.mark.parametrize("column", ["id", "label"])
def test_no_id_or_label_column(tmp_path: Path, column: str) -> None:
    rows = [{k: v for k, v in row.items() if k != column} for row in small_rows()]
    message = refused(rows, tmp_path)
    assert f"no column {column!r}" in message and f"data.{column}_column=" in message


def test_a_feature_value_that_is_not_a_number(tmp_path: Path) -> None:
    rows = [{**row, "y": str(row["y"])} for row in small_rows()]  # a column of text
    rows[6]["y"] = "n/a?"
    assert "column 'y' row 7 holds 'n/a?', not a number" in refused(rows, tmp_path)


def test_an_empty_sequence(tmp_path: Path) -> None:
    rows = [*small_rows(), {"id": "blank", "time": 0, "label": "up", "x": None, "y": None,
                            "z": None}]  # fmt: skip
    assert "sequence 'blank' is empty (rows [91]" in refused(rows, tmp_path, ".parquet")


def test_missing_values_are_refused_or_filled_with_the_training_mean(tmp_path: Path) -> None:
    rows = small_rows()
    rows[12]["x"] = float("nan")
    message = refused(rows, tmp_path, ".parquet")
    assert "column 'x' row 13 is empty or NaN" in message and "data.missing=mean" in message
    rows[12]["x"] = None  # an empty CSV cell
    module = data_module(write_table(rows, tmp_path / "filled.csv"), missing="mean")
    steps = torch.cat([s for split in (module.data_train, module.data_val, module.data_test)
                       for s, _ in split])  # fmt: skip
    assert not steps.isnan().any()
    assert (steps[:, 0] == 0).sum() == 1  # the training mean, standardised


@pytest.mark.parametrize("split", ["val", "test"])
def test_a_class_that_train_lacks(tmp_path: Path, split: str) -> None:
    rows = with_splits(pattern_rows(15, seed=3))
    for row in rows:
        if row["id"] == {"test": "s0", "val": "s1"}[split]:  # a class of its own
            row["label"] = "spike"
    message = refused(rows, tmp_path)
    assert f"class 'spike' is in the {split} split but not in train" in message


def test_counts_that_disagree_with_the_table(tmp_path: Path) -> None:
    rows = small_rows()
    assert "data.num_classes=4 but" in refused(rows, tmp_path, num_classes=4)
    assert "has a sequence of 10 steps" in refused(rows, tmp_path, max_length=9)


def test_a_table_with_no_rows(tmp_path: Path) -> None:
    assert "has no rows" in refused([], tmp_path)
    (tmp_path / "nothing.csv").write_text("")
    with pytest.raises(UserError, match="is empty: it has no header and no rows"):
        data_module(tmp_path / "nothing.csv")


def test_predict_step_passes_the_lengths(tmp_path: Path) -> None:
    from kindling.modules.classifier import Classifier

    net = LSTMClassifier(None, 3, hidden_size=8, num_features=FEATURES)
    module = Classifier(net, 3, optimizer=torch.optim.AdamW).eval()
    steps, lengths = torch.randn(2, 6, FEATURES), torch.tensor([6, 2])
    probabilities = module.predict_step((steps, lengths, torch.tensor([0, 1])), 0)
    torch.testing.assert_close(probabilities, net(steps, lengths).softmax(dim=-1))


@pytest.mark.slow
def test_two_processes_learn_sequences_and_test_each_one_once(
    compose_config, tmp_path: Path
) -> None:
    """Trained on 2 processes with length bucketing, the run learns the pattern; its test on 2
    processes counts each of the 31 test sequences once (2 x 16 would repeat one) and scores
    what one process scores."""
    table = write_table(pattern_rows(151, seed=0), tmp_path / "table.parquet")
    common = [
        "data=sequences", f"data.path={table}", "data.batch_size=16", "model=gru",
        "data.min_epoch_size=0",
        "model.net.hidden_size=32", "model.net.bidirectional=true", "trainer.accelerator=cpu",
        *QUIET,
    ]  # fmt: skip
    # Trained and then tested on 2 processes, with the weights it ended with: last.ckpt's. The
    # ranks are forked from this process (strategy=ddp_fork), which has imported all they need.
    two = compose_config(
        *common, "trainer.devices=2", "trainer.strategy=ddp_fork", "data.bucket=true",
        "model.optimizer.lr=0.003", "trainer.max_epochs=12",
    )  # fmt: skip
    run(in_folder(two, tmp_path / "two"))
    tested_by = {1: tmp_path / "run", 2: tmp_path / "two"}
    test = ["train=false", f"ckpt_path={tmp_path / 'two/checkpoints/last.ckpt'}"]
    run(compose_config(*common, *test, "trainer.devices=1"))  # one process: this one
    results = {}
    for devices, folder in tested_by.items():
        with open(folder / "csv" / "metrics.csv") as f:
            (row,) = [row for row in csv.DictReader(f) if row.get("test/acc")]
        counts = np.loadtxt(folder / "confusion_matrix.csv", delimiter=",")
        results[devices] = float(row["test/acc"]), int(counts.sum())
    assert results[2] == results[1]
    assert results[2][1] == 31
    assert results[2][0] >= 0.9
