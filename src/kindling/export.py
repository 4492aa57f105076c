"""Export a checkpoint to ONNX and to a `torch.export` program, checked against the checkpoint
(docs/resume.md, *Export*).

    python -m kindling.export ckpt_path=<file> [output=<path without suffix>]
        [format=both | onnx | torch_export] [tolerance=1e-4] [samples=8]

Writes `<output>.onnx`, `<output>.pt2` and `<output>.json`: what a consumer needs (the class
names, the inputs and their normalisation), also inside both files. Each file is then run on
random inputs; beyond `tolerance` from the checkpoint's logits it is deleted and the command
fails in one line. `output` defaults to the checkpoint's path less .ckpt.
"""

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch

from kindling import cli
from kindling.data.image_folder import to_model_input
from kindling.errors import UserError
from kindling.loading import data_state, load_module
from kindling.modules.classifier import Classifier

log = logging.getLogger("kindling")

FORMATS = {"onnx": (".onnx", "ONNX"), "torch_export": (".pt2", "torch.export")}  # suffix, name


@dataclass
class ExportArgs:
    ckpt_path: str  # a checkpoint written by train.py
    output: str | None = None  # path without suffix; null: the checkpoint's, less .ckpt
    format: str = "both"  # both | onnx | torch_export
    tolerance: float = 1e-4  # the largest absolute logit difference an export may have
    samples: int = 8  # random inputs (images or sequences) the parity check runs
    seed: int = 0  # of those inputs


Inputs = tuple[torch.Tensor, ...]  # what the module takes: (images,) or (steps, lengths)
Runner = Callable[[Inputs], torch.Tensor]


def export(args: ExportArgs) -> list[Path]:
    if args.format not in ("both", *FORMATS):
        raise UserError(f"format={args.format} is not one of both, onnx, torch_export.")
    if args.samples < 2:
        raise UserError(f"samples={args.samples}: the check needs at least 2 inputs.")
    module, checkpoint = load_module(
        args.ckpt_path, Classifier, "a language model generates with python -m kindling.sample."
    )
    facts = consumer_facts(checkpoint, args.ckpt_path)
    if facts["input"] == "sequences":  # a net reading patches takes whole patches, 2 at least
        facts["length_multiple"] = getattr(getattr(module.net, "stem", None), "patch", 1)
    stem = Path(args.output) if args.output else Path(args.ckpt_path).with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    inputs = sample_inputs(facts, args.samples, args.seed)
    with torch.no_grad():
        checks = [(example, module(*example)) for example in inputs]  # and the logits
    family = type(module.net).__name__
    if hasattr(module.net, "exportable"):
        # A recurrent net's packed sequences trace in neither exporter: its twin (its weights
        # shared) computes the same logits over the padded length, which the check compares.
        module.net = module.net.exportable()
    # Each batch's size, and a padded batch's length: `8 and 5` or `8x30 and 5x15`.
    sizes = " and ".join("x".join(map(str, x[0].shape[: len(x)])) for x in inputs)
    written = []
    for name in FORMATS if args.format == "both" else [args.format]:
        path = stem.with_suffix(FORMATS[name][0])
        try:
            run = EXPORTERS[name](module, inputs[0], path, facts)
            with torch.no_grad():  # the file run on every batch
                differences = [(run(x) - y).abs().max() for x, y in checks]
            difference = float(torch.stack(differences).max())  # NaN where any is
        except ImportError as error:  # what ONNX export needs and training does not
            raise UserError(
                f"ONNX export needs {error.name}: pip install -e '.[export]' (or "
                "format=torch_export)."
            ) from error
        except Exception as error:
            path.unlink(missing_ok=True)
            reason = (str(error).strip() or type(error).__name__).splitlines()[0][:300]
            raise UserError(
                f"{FORMATS[name][1]} cannot export this {family}: {reason}. Export "
                "with the other format (format=onnx or format=torch_export) or use the checkpoint."
            ) from error
        log.info("%s: largest logit difference from the checkpoint %.2e (tolerance %.0e), "
                 "batches of %s.", path, difference, args.tolerance, sizes)  # fmt: skip
        if not difference <= args.tolerance:  # NaN fails too
            path.unlink()
            raise UserError(
                f"The {name} export of this {family} differs from the checkpoint by "
                f"{difference:.2e} > tolerance={args.tolerance:.0e}: {path} deleted."
            )
        written.append(path)
    facts_file = stem.with_suffix(".json")
    facts_file.write_text(json.dumps(facts, indent=1) + "\n")
    return [*written, facts_file]


def consumer_facts(checkpoint: dict[str, Any], ckpt_path: str) -> dict[str, Any]:
    """What running the exported model needs: inputs and their normalisation, class names."""
    data_cfg, state = data_state(checkpoint, ckpt_path)
    model_cfg = checkpoint["config"]["model"]
    if state.get("features") is not None:  # data=sequences
        inputs = {
            "input": "sequences",
            "input_names": ["steps", "lengths"],
            "input_shape": ["batch", "length", len(state["features"])],
            "input_dtype": "float32",
            "lengths_shape": ["batch"],
            "lengths_dtype": "int64",
            "padding": "zeros after each sequence's last step, to a batch length of whole "
            "length_multiple steps (at least 2 of them where it is above 1); lengths: real steps",
            # The longest the model takes (the Transformer's learned positions); null: any.
            "max_length": model_cfg["net"].get("max_length"),
            "longest_trained": data_cfg.get("max_length"),
            "features": list(state["features"]),
            "normalisation": "(value - mean) / std, per feature; a missing value becomes 0",
        }
    else:
        inputs = {
            "input": "images",
            "input_shape": ["batch", *data_cfg["image_shape"]],
            "input_dtype": "float32",
            "normalisation": "(pixel / 255 - mean) / std, per channel",
        }
    return {
        **inputs,
        "mean": torch.as_tensor(state["mean"]).flatten().tolist(),
        "std": torch.as_tensor(state["std"]).flatten().tolist(),
        "output": "logits",
        "output_shape": ["batch", model_cfg["num_classes"]],
        "classes": state.get("classes") or [str(i) for i in range(model_cfg["num_classes"])],
        "net": model_cfg["net"]["_target_"],
        "checkpoint": str(ckpt_path),
    }


def sample_inputs(facts: dict[str, Any], count: int, seed: int) -> list[Inputs]:
    """Random inputs standardised as in training, in a batch of `count` and one of another size
    (the dynamic batch checked too). Sequences have random lengths up to the longest the model
    was trained on, the second batch padded to about half that (the dynamic length checked too),
    values drawn around the training statistics, zero-padded after each end."""
    generator = torch.Generator().manual_seed(seed)
    mean, std = torch.tensor(facts["mean"]), torch.tensor(facts["std"])
    # A checkpoint's data config holds the table's longest sequence; 64 where it has none.
    longest = facts.get("longest_trained") or facts.get("max_length") or 64
    batches: list[Inputs] = []
    for size, length in ((count, longest), (count // 2 + 1, (longest + 1) // 2)):
        if facts["input"] != "sequences":
            shape = (size, *facts["input_shape"][1:])
            pixels = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
            batches.append((to_model_input(pixels, mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)),))
            continue
        patch = facts["length_multiple"]  # a net reading patches: whole ones, at least 2
        length = length if patch == 1 else max(2, -(-length // patch)) * patch
        lengths = torch.randint(1, length + 1, (size,), generator=generator)
        lengths[0], lengths[-1] = length, 1  # the first as long as the batch, the last 1 step
        steps = torch.randn(size, length, len(mean), generator=generator)  # (x - mean) / std
        steps[torch.arange(length)[None, :] >= lengths[:, None]] = 0.0
        batches.append((steps, lengths))
    return batches


def input_signature(facts: dict[str, Any]) -> tuple[list[str], tuple[dict[int, Any], ...]]:
    """The exported inputs' names and dynamic dimensions: the batch; for sequences the length
    too, up to the net's `max_length` where it has one (the Transformer's learned positions), in
    whole patches where the net reads patches."""
    batch = torch.export.Dim("batch")
    if facts["input"] != "sequences":
        return ["images"], ({0: batch},)
    patch, longest = facts["length_multiple"], facts["max_length"]
    if patch == 1:
        length = torch.export.Dim("length", min=1, max=longest)
    else:  # whole patches, as `sample_inputs` pads a batch
        length = patch * torch.export.Dim("patches", min=2, max=longest and -(-longest // patch))
    return ["steps", "lengths"], ({0: batch, 1: length}, {0: batch})


def export_onnx(module: L.LightningModule, example: Inputs, path: Path, facts: dict) -> Runner:
    """The dynamo ONNX exporter (Lightning's `to_onnx(dynamo=True)`), the facts in the model's
    metadata; returns a function that runs the file with onnxruntime."""
    import onnxruntime
    import onnxscript  # noqa: F401 - what the dynamo exporter writes ONNX with

    names, dynamic_shapes = input_signature(facts)
    program = module.to_onnx(
        None, example, dynamo=True, input_names=names, output_names=["logits"],
        dynamic_shapes=dynamic_shapes, verbose=False,
    )  # fmt: skip
    program.model.metadata_props.update({key: json.dumps(value) for key, value in facts.items()})
    program.save(str(path))  # weights inside the file up to ONNX's 2 GB, beside it above
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(inputs: Inputs) -> torch.Tensor:
        feed = {name: tensor.numpy() for name, tensor in zip(names, inputs, strict=True)}
        return torch.from_numpy(session.run(["logits"], feed)[0])

    return run


def export_program(module: L.LightningModule, example: Inputs, path: Path, facts: dict) -> Runner:
    """`torch.export` of the module, saved with the facts; returns a function that loads the
    file back and runs it."""
    program = torch.export.export(module, example, dynamic_shapes=input_signature(facts)[1])
    torch.export.save(program, path, extra_files={"kindling.json": json.dumps(facts)})
    loaded = torch.export.load(path).module()
    return lambda inputs: loaded(*inputs)


EXPORTERS = {"onnx": export_onnx, "torch_export": export_program}


@cli.command(ExportArgs, "python -m kindling.export ckpt_path=<file> [output=<path>] "
             "[format=both|onnx|torch_export]")  # fmt: skip
def main(args: ExportArgs) -> None:
    log.info("Exported: %s", ", ".join(str(path) for path in export(args)))


if __name__ == "__main__":
    main()
