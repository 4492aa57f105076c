"""Export a checkpoint to ONNX and to a `torch.export` program, checked against the checkpoint.

    python -m kindling.export ckpt_path=<file> [output=<path without suffix>]
        [format=both | onnx | torch_export] [tolerance=1e-4] [samples=8]

Writes `<output>.onnx` (the dynamo exporter, opset 18+; run it with onnxruntime),
`<output>.pt2` (`torch.export.save`; `torch.export.load(path).module()` runs it) and
`<output>.json`, the facts a consumer needs, also stored in the files (the ONNX model's
metadata_props; the .pt2 archive's `extra_files["kindling.json"]`): class names, input shape,
the normalisation to apply and the batch dimension, which is dynamic. The exported model takes
what the checkpoint's module takes: float32 images `(B, C, H, W)`, each channel standardised
as `(pixel / 255 - mean) / std`, and returns logits `(B, num_classes)`.

Each exported file is then run (onnxruntime for ONNX) on `samples` random images, standardised
with the checkpoint's statistics, and on a batch of another size; the largest absolute
difference from the checkpoint's logits is printed. Beyond `tolerance` the file is deleted and
the command fails with one line. `output` defaults to the checkpoint's path less `.ckpt`.
"""

import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from kindling.config.cli_args import parse_cli_args
from kindling.config.errors import UserError
from kindling.data.normalize import to_model_input
from kindling.garbage_collection import skip_collections_at_exit
from kindling.known_warnings import ignore_unhelpful_warnings
from kindling.loading import load_module
from kindling.modules.classifier import Classifier

log = logging.getLogger("kindling")

FORMATS = {"onnx": ".onnx", "torch_export": ".pt2"}


@dataclass
class ExportArgs:
    ckpt_path: str = "???"  # a checkpoint written by train.py
    output: str | None = None  # path without suffix; null: the checkpoint's, less .ckpt
    format: str = "both"  # both | onnx | torch_export
    tolerance: float = 1e-4  # the largest absolute logit difference an export may have
    samples: int = 8  # random images the parity check runs
    seed: int = 0  # of those images


USAGE = "python -m kindling.export ckpt_path=<file> [output=<path>] [format=both|onnx|torch_export]"


def export(args: ExportArgs) -> list[Path]:
    """Write and check each format `args` asks for; return the files written."""
    formats = list(FORMATS) if args.format == "both" else [args.format]
    if args.format != "both" and args.format not in FORMATS:
        raise UserError(f"format={args.format} is not one of both, onnx, torch_export.")
    if args.samples < 2:
        raise UserError(f"samples={args.samples}: the check needs at least 2 images.")
    module, checkpoint = load_module(args.ckpt_path)
    if not isinstance(module, Classifier):
        raise UserError(
            f"{args.ckpt_path} holds a {type(module).__name__}: kindling.export exports image "
            "classifiers (a language model generates with python -m kindling.sample)."
        )
    facts = consumer_facts(checkpoint, args.ckpt_path)
    stem = Path(args.output) if args.output else Path(args.ckpt_path).with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    inputs = sample_inputs(facts, args.samples, args.seed)
    with torch.no_grad():
        expected = [module(images) for images in inputs]
    family = checkpoint["config"]["model"]["net"]["_target_"].rsplit(".", 1)[-1]
    written = []
    for name in formats:
        path = stem.with_suffix(FORMATS[name])
        run = EXPORTERS[name](module, inputs[0], path, facts, family)
        difference = max(
            float((run_checked(run, images, name, path) - logits).abs().max())
            for images, logits in zip(inputs, expected, strict=True)
        )
        log.info("%s: largest logit difference from the checkpoint %.2e (tolerance %.0e), "
                 "batches of %d and %d.", path, difference, args.tolerance,
                 *[len(x) for x in inputs])  # fmt: skip
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
    """What running the exported model needs: input shape and normalisation, class names."""
    data_cfg = checkpoint["config"]["data"]
    state = checkpoint.get(data_cfg["_target_"].rsplit(".", 1)[-1], {})
    if state.get("mean") is None:
        raise UserError(f"{ckpt_path} has no image statistics: retrain with this version.")
    num_classes = checkpoint["config"]["model"]["num_classes"]
    return {
        "input": "images",
        "input_shape": ["batch", *data_cfg["image_shape"]],
        "input_dtype": "float32",
        "normalisation": "(pixel / 255 - mean) / std, per channel",
        "mean": torch.as_tensor(state["mean"]).flatten().tolist(),
        "std": torch.as_tensor(state["std"]).flatten().tolist(),
        "output": "logits",
        "output_shape": ["batch", num_classes],
        "classes": state.get("classes") or [str(i) for i in range(num_classes)],
        "net": checkpoint["config"]["model"]["net"]["_target_"],
        "checkpoint": str(ckpt_path),
    }


def sample_inputs(facts: dict[str, Any], count: int, seed: int) -> list[torch.Tensor]:
    """Random uint8 images standardised as in training: `count` of them, and a batch of
    another size (`count // 2 + 1`), so the dynamic batch dimension is checked too."""
    generator = torch.Generator().manual_seed(seed)
    shape = facts["input_shape"][1:]
    mean = torch.tensor(facts["mean"]).view(1, -1, 1, 1)
    std = torch.tensor(facts["std"]).view(1, -1, 1, 1)
    batches = []
    for size in (count, count // 2 + 1):
        pixels = torch.randint(0, 256, (size, *shape), generator=generator, dtype=torch.uint8)
        batches.append(to_model_input(pixels, mean, std))
    return batches


Runner = Callable[[torch.Tensor], torch.Tensor]


def export_onnx(
    module: L.LightningModule, example: torch.Tensor, path: Path, facts: dict, family: str
) -> Runner:
    """The dynamo ONNX exporter (Lightning's `to_onnx(dynamo=True)`), the facts in the model's
    metadata; returns a function that runs the file with onnxruntime."""
    try:
        import onnxruntime
        import onnxscript  # noqa: F401 - what the dynamo exporter writes ONNX with
    except ImportError as error:
        raise UserError(
            f"ONNX export needs {error.name}: pip install -e '.[export]' (or format=torch_export)."
        ) from error
    try:
        program = module.to_onnx(
            None, (example,), dynamo=True, input_names=["images"], output_names=["logits"],
            dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False,
        )  # fmt: skip
    except Exception as error:
        raise cannot_export("ONNX", family, error) from error
    program.model.metadata_props.update({key: json.dumps(value) for key, value in facts.items()})
    program.save(str(path))  # weights inside the file up to ONNX's 2 GB, beside it above
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(images: torch.Tensor) -> torch.Tensor:
        (logits,) = session.run(["logits"], {"images": images.numpy()})
        return torch.from_numpy(np.asarray(logits))

    return run


def export_program(
    module: L.LightningModule, example: torch.Tensor, path: Path, facts: dict, family: str
) -> Runner:
    """`torch.export` of the module, saved with the facts; returns a function that loads the
    file back and runs it."""
    try:
        program = torch.export.export(
            module, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},)
        )
    except Exception as error:
        raise cannot_export("torch.export", family, error) from error
    torch.export.save(program, path, extra_files={"kindling.json": json.dumps(facts)})
    loaded = torch.export.load(path).module()

    def run(images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return loaded(images)

    return run


def run_checked(run: "Runner", images: torch.Tensor, name: str, path: Path) -> torch.Tensor:
    """The exported file's logits; a file that does not run is deleted and refused."""
    try:
        return run(images)
    except Exception as error:
        path.unlink()
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(
            f"The {name} export fails on a batch of {len(images)}: {reason[:300]}. {path} deleted."
        ) from error


def cannot_export(exporter: str, family: str, error: Exception) -> UserError:
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return UserError(
        f"{exporter} cannot export this {family}: {reason[:300]}. Export with the other "
        "format (format=onnx or format=torch_export) or use the checkpoint."
    )


EXPORTERS = {"onnx": export_onnx, "torch_export": export_program}


def main(argv: list[str]) -> None:
    # The exporters' own INFO lines (graph passes) are not the user's business.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    ignore_unhelpful_warnings()
    try:
        args = parse_cli_args(ExportArgs, argv, USAGE)
        written = export(args)
    except UserError as error:
        log.error("%s", error)
        sys.exit(1)
    log.info("Exported: %s", ", ".join(str(path) for path in written))


if __name__ == "__main__":
    skip_collections_at_exit()
    main(sys.argv[1:])
