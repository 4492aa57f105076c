"""Write an optimized, chunked copy of a data set's splits for streaming (`data=streaming`).

    python -m kindling.prepare data=image_folder data.path=<images> output=<folder>

Each split (`<folder>/train`, `val`, `test`) is written by LitData's `optimize()` in parallel
workers: images as the data config serves them before augmentation (uint8), or sequences as the
table holds them, in a seeded random order (LitData's shuffling only reorders chunks and the
samples within a worker's chunks: a copy in an image folder's order would stream batches of
mostly one class). `<folder>/kindling.json` describes the copy (kindling.data.streaming).
"""

import functools
import json
import logging
import multiprocessing
import shlex
import shutil
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from litdata import optimize
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.utils.data import Dataset

import kindling
from kindling import cli
from kindling.config import resolvers  # noqa: F401 - importing registers the resolvers
from kindling.config.instantiate import build, check_arguments
from kindling.data import streaming
from kindling.data.loaders import SPLITS
from kindling.data.sequences import Sequences
from kindling.data.workers import default_num_workers
from kindling.errors import UserError

log = logging.getLogger("kindling")

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def stored_sample(dataset: Dataset, mean: torch.Tensor, std: torch.Tensor, index: int) -> dict:
    """Sample `index` of `dataset` as stored, with its label and index: a uint8 image, or a
    sequence as the table holds it (NaN where a value is missing)."""
    if isinstance(dataset, Sequences):
        steps, label = dataset.sequences[index].contiguous(), dataset.labels[index]
        return {"index": index, "steps": steps, "label": int(label)}
    image, label = dataset[index]
    if image.dtype != torch.uint8:  # an in-memory set's standardised floats: back to pixels
        image = (image * std + mean).mul_(255.0).round_().clamp_(0, 255).to(torch.uint8)
    return {"index": index, "image": image.contiguous(), "label": int(label)}


def prepare(cfg: DictConfig) -> Path:
    """Write the prepared copy that `cfg` describes; return its folder."""
    if OmegaConf.is_missing(cfg, "output"):
        raise UserError("Give the folder to write the copy into: output=<folder>.")
    output, metadata_file = Path(cfg.output), Path(cfg.output) / streaming.METADATA_FILE
    if "://" in cfg.output:
        raise UserError(
            f"output={cfg.output}: prepare writes to a local folder; copy it to object storage "
            "afterwards (e.g. aws s3 sync <folder> s3://bucket/prefix)."
        )
    data_cfg = cfg.data.copy()
    with open_dict(data_cfg):
        # Stored as the data set serves it; data=streaming augments while training.
        data_cfg.pop("augment", None)
        if "decode_device" in data_cfg:
            data_cfg.decode_device = "cpu"
    source = OmegaConf.to_container(data_cfg, resolve=True)
    if _finished(output, source):
        return output

    check_arguments(data_cfg, "data")
    datamodule = build(data_cfg, "data")
    datamodule.setup("fit")
    splits = {name: getattr(datamodule, f"data_{name}") for name in SPLITS}
    num_classes = datamodule.hparams.num_classes
    metadata: dict[str, Any] = {
        "format": streaming.FORMAT,
        "kindling_version": kindling.__version__,
        "classes": getattr(datamodule, "classes", None) or [str(i) for i in range(num_classes)],
    }
    mean, std = datamodule.mean, datamodule.std
    if isinstance(splits["train"], Sequences):
        longest = max(len(steps) for data in splits.values() for steps in data.sequences)
        metadata |= {
            "kind": streaming.SEQUENCES,
            "features": datamodule.features,
            "num_features": len(datamodule.features),
            # What data=sequences gives the model configs: the table's longest, unless set.
            "max_length": datamodule.hparams.max_length or longest,
        }
    else:
        mean, std = mean.view(-1, 1, 1), std.view(-1, 1, 1)
        image = stored_sample(splits["train"], mean, std, 0)["image"]
        metadata |= {"kind": streaming.IMAGES, "image_shape": list(image.shape)}
    metadata |= {
        "mean": mean.flatten().tolist(),
        "std": std.flatten().tolist(),
        "splits": {name: len(dataset) for name, dataset in splits.items()},
        "source": source,
    }
    output.mkdir(parents=True, exist_ok=True)
    metadata_file.write_text(json.dumps(metadata, indent=1))  # the folder is ours; not complete
    workers = cfg.num_workers if cfg.num_workers is not None else default_num_workers(1)
    generator = torch.Generator().manual_seed(cfg.seed if cfg.get("seed") is not None else 0)
    for name, dataset in splits.items():
        log.info("Writing %s: %d samples, %d workers.", output / name, len(dataset), workers)
        shutil.rmtree(output / name, ignore_errors=True)  # an interrupted prepare's part
        optimize(
            fn=functools.partial(stored_sample, dataset, mean, std),
            inputs=torch.randperm(len(dataset), generator=generator).tolist(),
            output_dir=str((output / name).resolve()),
            num_workers=min(workers, len(dataset)),
            chunk_bytes=cfg.chunk_bytes,
            # fork: workers start at once, with the data set in memory (spawn re-imports torch).
            start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else None,
            verbose=False,  # its setup, its workers, and a sign-up line: the line above says it
        )
    metadata["complete"] = True
    metadata_file.write_text(json.dumps(metadata, indent=1))  # last: the copy is whole
    counts = ", ".join(f"{name} {count}" for name, count in metadata["splits"].items())
    log.info("Prepared %s (%s). Train with: %s", output, counts,
             train_command(output, metadata["kind"]))  # fmt: skip
    return output


def _finished(output: Path, source: dict[str, Any]) -> bool:
    """Whether `output` holds a finished copy of `source`; refuse a folder that is not ours."""
    if not (output / streaming.METADATA_FILE).is_file():
        if output.exists() and any(output.iterdir()):
            raise UserError(
                f"output={output} holds files that are not a prepared copy. Give an empty or "
                "new folder."
            )
        return False
    try:
        metadata = streaming.read_metadata(str(output))
    except UserError:  # cut short, unfinished or older
        log.info("%s is an unfinished or older prepared copy: preparing it again.", output)
        return False
    if metadata.get("source") != source:
        raise UserError(
            f"output={output} already holds a prepared copy of another data config "
            f"({metadata.get('source')}). Give another output, or delete that folder."
        )
    log.info("%s is already prepared (%s): nothing to do. Delete it to prepare again. Train "
             "with: %s", output, ", ".join(f"{k} {v}" for k, v in metadata["splits"].items()),
             train_command(output, metadata["kind"]))  # fmt: skip
    return True


def train_command(output: Path, kind: str) -> str:
    """The command that trains on the copy: the image models read no sequences."""
    model = ["model=lstm"] if kind == streaming.SEQUENCES else []
    return shlex.join(["python", "train.py", "data=streaming", f"data.input_dir={output}", *model])


@hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name="prepare")
@cli.main
def main(cfg: DictConfig) -> None:
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, verbose=False)
    prepare(cfg)


if __name__ == "__main__":
    main()
