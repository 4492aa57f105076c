"""Exporting a checkpoint to ONNX and torch.export, checked against the checkpoint."""

import json
import logging
from pathlib import Path

import onnx
import onnxruntime
import pytest
import torch

from kindling import export as export_command
from kindling.errors import UserError
from kindling.export import ExportArgs, export
from kindling.loading import load_module
from kindling.train import run

from forked import run_forked
from helpers import QUIET, compose_in, error_lines, pattern_rows, write_table

SHORT_RUN = [
    "trainer=cpu", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1", "test=false", *QUIET,
    "callbacks.plots=null",  # a third of each run's time, and no export reads them
]  # fmt: skip


@pytest.fixture(scope="module", params=["transformer", "timm"])
def family_checkpoint(request, tmp_path_factory) -> Path:
    """A checkpoint of a Transformer, and of a timm net, after two steps on the digits."""
    folder = tmp_path_factory.mktemp(request.param)
    net = ["model.net.name=test_resnet"] if request.param == "timm" else []
    run(compose_in(folder, f"model={request.param}", *net, *SHORT_RUN))
    return folder / "run" / "checkpoints" / "last.ckpt"


def test_transformer_and_timm_export_and_match_their_checkpoint(
    family_checkpoint: Path, tmp_path: Path
) -> None:
    onnx_file, program_file, facts_file = export(
        ExportArgs(ckpt_path=str(family_checkpoint), output=str(tmp_path / "model"))
    )
    facts = json.loads(facts_file.read_text())
    assert facts["input_shape"] == ["batch", 1, 8, 8] and len(facts["classes"]) == 10
    assert len(facts["mean"]) == len(facts["std"]) == 1
    # The consumer's facts travel inside both files.
    metadata = {p.key: json.loads(p.value) for p in onnx.load(str(onnx_file)).metadata_props}
    assert metadata == facts
    extra = {"kindling.json": ""}
    program = torch.export.load(program_file, extra_files=extra)
    assert json.loads(extra["kindling.json"]) == facts

    # Both files compute the checkpoint's logits on a batch size never exported.
    module, _ = load_module(family_checkpoint)
    images = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        expected = module(images)
        assert torch.allclose(program.module()(images), expected, atol=1e-5)
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"images": images.numpy()})
    assert torch.allclose(torch.from_numpy(logits), expected, atol=1e-4)


@pytest.mark.slow
def test_the_command_exports_the_cnn_and_prints_the_differences(
    trained_run, tmp_path: Path
) -> None:
    result = run_forked(
        "-m kindling.export",
        [f"ckpt_path={trained_run.best_checkpoint}", f"output={tmp_path / 'cnn'}"],
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "largest logit difference" in line]
    assert [Path(line.split(":")[0]).name for line in lines] == ["cnn.onnx", "cnn.pt2"]
    assert all("tolerance 1e-04" in line for line in lines)
    assert {p.name for p in tmp_path.iterdir()} >= {"cnn.onnx", "cnn.pt2", "cnn.json"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_checkpoint_exports_within_the_tolerance(gpu_trained_run, tmp_path: Path) -> None:
    checkpoint = gpu_trained_run.best_checkpoint
    files = export(ExportArgs(ckpt_path=str(checkpoint), output=str(tmp_path / "cnn")))
    assert [f.name for f in files] == ["cnn.onnx", "cnn.pt2", "cnn.json"]  # both checked
    module, _ = load_module(checkpoint)
    images = torch.randn(5, 1, 8, 8)
    session = onnxruntime.InferenceSession(str(files[0]), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"images": images.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(logits), module(images), atol=1e-4, rtol=0)


def export_off_by_a_little(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The `name` exporter's files give the right logits plus 1e-3: over the tolerance."""
    exporter = export_command.EXPORTERS[name]

    def off_by_a_little(*args):
        runner = exporter(*args)
        return lambda inputs: runner(inputs) + 1e-3

    monkeypatch.setitem(export_command.EXPORTERS, name, off_by_a_little)


def test_an_export_that_computes_something_else_is_refused_in_one_line(
    trained_run, tmp_path: Path, monkeypatch, caplog
) -> None:
    export_off_by_a_little(monkeypatch, "onnx")
    argv = [f"ckpt_path={trained_run.last_checkpoint}", f"output={tmp_path / 'm'}", "format=onnx"]
    with pytest.raises(SystemExit) as stopped:
        export_command.main(argv)
    assert stopped.value.code == 1
    (line,) = error_lines(caplog)
    assert "The onnx export of this CNNClassifier differs from the checkpoint by 1.00e-03 > " \
           "tolerance=1e-04" in line, line  # fmt: skip
    assert not (tmp_path / "m.onnx").exists()
    # A looser tolerance accepts the same difference.
    export(ExportArgs(str(trained_run.last_checkpoint), str(tmp_path / "m"), "onnx", 1e-2))
    assert (tmp_path / "m.onnx").is_file()


def test_a_net_the_exporter_cannot_trace_is_one_line(
    trained_run, tmp_path: Path, monkeypatch
) -> None:
    def untraceable(*args, **kwargs):
        raise RuntimeError("data-dependent control flow\nmore detail")

    monkeypatch.setattr(torch.export, "export", untraceable)
    args = ExportArgs(str(trained_run.last_checkpoint), str(tmp_path / "m"), "torch_export")
    with pytest.raises(UserError) as refused:
        export(args)
    assert "torch.export cannot export this CNNClassifier: data-dependent control flow. " \
           "Export with the other format" in str(refused.value)  # fmt: skip
    with pytest.raises(UserError, match="format=tflite is not one of"):
        export(ExportArgs(str(trained_run.last_checkpoint), format="tflite"))


# Every family that reads sequences, small, after two steps on a table of lengths 3 to 20.
SEQUENCE_FAMILIES = {
    "rnn": ["model=rnn", "model.net.hidden_size=8", "model.net.num_layers=1"],
    "lstm": ["model=lstm", "model.net.hidden_size=8", "model.net.num_layers=1"],
    "gru_bidirectional": ["model=gru", "model.net.hidden_size=8", "model.net.num_layers=1",
                          "model.net.bidirectional=true"],
    "transformer_cls": ["model=transformer", "model.net.d_model=16", "model.net.num_layers=1"],
    "transformer_mean": ["model=transformer", "model.net.d_model=16", "model.net.num_layers=1",
                         "model.net.pooling=mean"],
    "temporal_conv": ["model=temporal_conv", "model.net.channels=[8]",
                      "model.net.kernel_sizes=[3]"],
    # Long sequences' patches: a batch's length in whole patches of 3 steps.
    "lstm_patches": ["model=lstm", "model.net.hidden_size=8", "model.net.num_layers=1",
                     "model.net.patch_length=3", "+model.net.stem_width=8"],
    "transformer_patches": ["model=transformer", "model.net.d_model=16", "model.net.num_layers=1",
                            "model.net.patch_length=3"],
}  # fmt: skip


@pytest.fixture(scope="module", params=list(SEQUENCE_FAMILIES))
def sequence_checkpoint(request, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    table = write_table(pattern_rows(30, seed=0, lengths=(3, 20)), folder / "table.csv")
    run(compose_in(folder, "data=sequences", "data.min_epoch_size=0", f"data.path={table}",
                   *SEQUENCE_FAMILIES[request.param], *SHORT_RUN))  # fmt: skip
    return folder / "run" / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_every_sequence_family_exports_with_a_dynamic_batch_and_length(
    sequence_checkpoint: Path, tmp_path: Path, caplog
) -> None:
    with caplog.at_level(logging.INFO, logger="kindling"):
        onnx_file, program_file, facts_file = export(
            ExportArgs(ckpt_path=str(sequence_checkpoint), output=str(tmp_path / "model"))
        )
    facts = json.loads(facts_file.read_text())
    patch = facts["length_multiple"]
    assert patch == (3 if "patches" in sequence_checkpoint.parts[-4] else 1)
    # The parity check ran two batch sizes padded to two lengths (the table's longest: 20), in
    # whole patches where the net reads them.
    lengths_checked = "8x21 and 5x12" if patch == 3 else "8x20 and 5x10"
    checked = [r.getMessage() for r in caplog.records if "logit difference" in r.getMessage()]
    assert len(checked) == 2 and all(lengths_checked in line for line in checked)
    assert facts["input"] == "sequences" and facts["input_shape"] == ["batch", "length", 3]
    assert facts["features"] == ["x", "y", "z"] and len(facts["mean"]) == len(facts["std"]) == 3
    assert facts["normalisation"].startswith("(value - mean) / std")
    assert facts["classes"] == ["down", "flat", "up"]
    metadata = {p.key: json.loads(p.value) for p in onnx.load(str(onnx_file)).metadata_props}
    assert metadata == facts

    # Both files on batches and lengths never exported: every sequence one step; lengths 1-13.
    module, _ = load_module(sequence_checkpoint)
    program = torch.export.load(program_file).module()
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    for steps, lengths in ((torch.randn(3, 1, 3), torch.ones(3, dtype=torch.long)),
                           (torch.randn(2, 13, 3), torch.tensor([13, 4]))):  # fmt: skip
        steps[1, lengths[1] :] = 0.0
        padded = steps.shape[1] if patch == 1 else max(2, -(-steps.shape[1] // patch)) * patch
        steps = torch.nn.functional.pad(steps, (0, 0, 0, padded - steps.shape[1]))
        with torch.no_grad():
            expected = module(steps, lengths)
            torch.testing.assert_close(program(steps, lengths), expected, atol=1e-5, rtol=0)
        (logits,) = session.run(None, {"steps": steps.numpy(), "lengths": lengths.numpy()})
        torch.testing.assert_close(torch.from_numpy(logits), expected, atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("sequence_checkpoint", ["rnn"], indirect=True)  # the same check for all
def test_a_sequence_export_that_computes_something_else_is_refused(
    sequence_checkpoint: Path, tmp_path: Path, monkeypatch
) -> None:
    export_off_by_a_little(monkeypatch, "torch_export")
    with pytest.raises(
        UserError,
        match=r"The torch_export export of this RNNClassifier differs "
        r"from the checkpoint by 1.00e-03 > tolerance=1e-04",
    ):
        export(ExportArgs(str(sequence_checkpoint), str(tmp_path / "m"), "torch_export"))
    assert not (tmp_path / "m.pt2").exists()
