"""Images per second of data=streaming (a local prepared copy, LitData) against data=image_folder
on the same images, with the same workers, batch size and augmentation.

    python benchmarks/streaming.py --images 2000 --workers 2 --repeats 3

The JPEG files of benchmarks/loader.py (smooth random colour fields of `--file-size` pixels,
`--classes` classes) are written once to a temporary folder and prepared once with
`python -m kindling.prepare` (decoded, resized to `--image-size`, stored as uint8 chunks; the
prepare time is printed, not counted). Each side serves shuffled training batches with random
crop and flip in its workers, then the conversion and normalisation done after the batch
reaches the device (here the CPU), included in its time. Each side is timed over one full epoch
after a first epoch that starts its workers; the sides alternate, `--repeats` times, in one
process. Prints images/s and streaming / image_folder.

Writes `streaming.json` to `benchmarks/results/` (or `--out`).
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from loader import (
    PADDING,
    images_per_second,
    kindling_datamodule,
    loader_arguments,
    write_files,
)
from torchvision.transforms import v2

from kindling.data.streaming import StreamingDataModule
from kindling.prepare import CONFIGS, prepare


def prepared_copy(root: Path, output: Path, args: argparse.Namespace) -> float:
    """Prepare the image folder into `output`; return the seconds it took."""
    overrides = [
        "data=image_folder", f"data.path={root}", f"data.image_size={args.image_size}",
        "data.val_fraction=0.01", "data.test_fraction=0.01", f"output={output}",
        f"num_workers={args.workers}",
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="prepare", overrides=overrides)
    start = time.perf_counter()
    prepare(cfg)
    return time.perf_counter() - start


def streaming_datamodule(output: Path, args: argparse.Namespace) -> StreamingDataModule:
    augment = {
        "crop": v2.RandomCrop(args.image_size, padding=PADDING),
        "flip": v2.RandomHorizontalFlip(),
    }
    datamodule = StreamingDataModule(
        str(output), num_classes=args.classes, image_shape=[3, args.image_size, args.image_size],
        batch_size=args.batch_size, num_workers=args.workers, augment=augment, shuffle_seed=0,
    )  # fmt: skip
    datamodule.setup("fit")
    return datamodule


def main() -> None:
    args = loader_arguments(__doc__.split("\n")[0]).parse_args()
    result: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    with tempfile.TemporaryDirectory() as folder:
        root, output = Path(folder) / "images", Path(folder) / "prepared"
        write_files(root, args.images, args.classes, args.file_size)
        result["prepare_s"] = prepared_copy(root, output, args)
        datamodules = {
            "image_folder": kindling_datamodule(root, args),
            "streaming": streaming_datamodule(output, args),
        }
        loaders = {side: data.train_dataloader() for side, data in datamodules.items()}
        sides: dict[str, list[float]] = {side: [] for side in datamodules}
        for repeat in range(args.repeats):
            order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
            for side in order:
                on_device = datamodules[side].on_after_batch_transfer
                rate = images_per_second(loaders[side], lambda b: on_device(b, 0))  # noqa: B023
                sides[side].append(rate)
                print(f"repeat {repeat} {side:<12} {rate:8.0f} images/s")
        ratios = sorted(
            s / f for s, f in zip(sides["streaming"], sides["image_folder"], strict=True)
        )
        result["loader"] = {side: statistics.median(values) for side, values in sides.items()}
        result["loader"] |= {
            "ratio_median": statistics.median(ratios), "ratio_min": ratios[0],
            "ratio_max": ratios[-1],
        }  # fmt: skip
        loader = result["loader"]
        print(
            f"\n{args.images} JPEG files {args.file_size}px -> {args.image_size}px, crop+flip, "
            f"batch {args.batch_size}, {args.workers} workers "
            f"(prepare: {result['prepare_s']:.1f} s, not counted):\n"
            f"  kindling image_folder          {loader['image_folder']:8.0f} images/s\n"
            f"  kindling streaming (local)     {loader['streaming']:8.0f} images/s\n"
            f"  streaming / image_folder: {loader['ratio_median']:.2f} "
            f"(min {loader['ratio_min']:.2f}, max {loader['ratio_max']:.2f})"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "streaming.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
