"""What the data fingerprint of a checkpoint costs (kindling/data/fingerprint.py): computed once
per fit, at its first checkpoint (or, resuming, when the checkpoint is loaded).

    python benchmarks/fingerprint.py

Writes, into a temporary folder, a folder of 20,000 PNG images (10 classes, 32x32) and a table
of 1,000,000 rows (10,000 sequences of 100 steps, 3 features, Parquet); sets up the data module
each one configures (`data=image_folder`, `data=sequences`) and the digits; then times
`fingerprint(datamodule)` three times each and prints the fastest, beside the set-up's time.
"""

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from hydra.utils import instantiate
from overhead import compose_kindling, cpu_name
from PIL import Image

from kindling.data.fingerprint import fingerprint

IMAGES, CLASSES, SEQUENCES, STEPS = 20_000, 10, 10_000, 100


def image_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for i in range(IMAGES):
        folder = root / f"class{i % CLASSES}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def table(path: Path) -> Path:
    rng = np.random.default_rng(0)
    rows = SEQUENCES * STEPS
    columns = {
        "id": np.repeat(np.arange(SEQUENCES), STEPS),
        "time": np.tile(np.arange(STEPS), SEQUENCES),
        "label": np.repeat(rng.integers(0, 3, SEQUENCES), STEPS).astype(str),
        **{f"x{k}": rng.normal(size=rows).astype(np.float32) for k in range(3)},
    }
    pq.write_table(pa.table(columns), path)
    return path


def measure(name: str, data: str, overrides: tuple[str, ...], tmp: Path) -> None:
    cfg = compose_kindling("cnn", "cpu", 1, tmp, overrides, data=data)
    started = time.perf_counter()
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    set_up = time.perf_counter() - started
    times = []
    for _ in range(3):
        started = time.perf_counter()
        fingerprint(datamodule)
        times.append(time.perf_counter() - started)
    print(f"| {name} | {set_up:.2f} | {min(times):.3f} |")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kindling-fingerprint-") as scratch:
        tmp = Path(scratch)
        folder, rows = image_folder(tmp / "images"), table(tmp / "table.parquet")
        print(f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads\n")
        print("| data | set-up s | fingerprint s |\n| --- | ---: | ---: |")
        measure("digits (1,797 images in memory)", "digits", (), tmp)
        measure(f"image folder ({IMAGES:,} PNG files)", "image_folder",
                (f"data.path={folder}",), tmp)  # fmt: skip
        measure(f"sequence table ({SEQUENCES * STEPS:,} rows)", "sequences",
                (f"data.path={rows}",), tmp)  # fmt: skip


if __name__ == "__main__":
    main()
