"""Images per second of kindling's image-folder loader against a plain torchvision one, and the
cost of augmenting whole batches on the device.

    python benchmarks/loader.py --images 2000 --workers 2 --repeats 3

1. Loader. The same JPEG files (written once to a temporary folder: smooth random colour
   fields of `--file-size` pixels, `--classes` classes), resized to `--image-size`, with the same
   training transforms (random crop with padding, horizontal flip) and the same number of
   workers and batch size, shuffled, persistent workers. Plain: `torchvision.datasets.ImageFolder`
   (PIL decoding) + `DataLoader`, transforms ending in float conversion and normalisation in the
   workers. kindling: `ImageFolderDataModule` (torchvision.io decoding, uint8 batches) plus the
   conversion and normalisation it does after the batch reaches the device (here the CPU),
   included in its time. Each side is timed over one full epoch after a first epoch that starts
   its workers; the sides alternate, `--repeats` times. Prints images/s and kindling / plain.
2. Device augmentation. The per-image random crop and flip of in-memory data sets on a batch of
   512 CIFAR-sized images (3x32x32), against one training step (forward, backward, AdamW) of
   the default CNN (configs/model/cnn.yaml) on that batch, on the CPU: the median of `--steps`.
3. GPU decoding (`data.decode_device=cuda`), when CUDA is available: the kindling loader's
   images/s with nvJPEG decoding on the GPU. Skipped without CUDA.

Writes `loader.json` to `benchmarks/results/` (or `--out`).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import datasets
from torchvision.transforms import v2

from kindling.data.augment import BatchAugment
from kindling.data.image_folder import ImageFolderDataModule
from kindling.models.cnn import CNNClassifier

PADDING = 4


def write_files(root: Path, images: int, classes: int, size: int) -> None:
    """Smooth random colour fields (8x8 noise upsampled), saved as JPEG: photo-like to decode."""
    generator = torch.Generator().manual_seed(0)
    for i in range(images):
        folder = root / f"class_{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        coarse = torch.rand(1, 3, 8, 8, generator=generator)
        field = F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
        pixels = (field[0].clamp(0, 1) * 255).byte().permute(1, 2, 0).numpy()
        Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", quality=90)


def images_per_second(loader, finish) -> float:
    """One full epoch after a warm-up epoch (worker start-up is not counted)."""
    for batch in loader:
        finish(batch)
    count, start = 0, time.perf_counter()
    for batch in loader:
        count += len(finish(batch)[0])
    return count / (time.perf_counter() - start)


def plain_loader(root: Path, args: argparse.Namespace, mean, std) -> DataLoader:
    transform = v2.Compose([
        v2.Resize((args.image_size, args.image_size), antialias=True),
        v2.RandomCrop(args.image_size, padding=PADDING),
        v2.RandomHorizontalFlip(),
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean, std),
    ])  # fmt: skip
    dataset = datasets.ImageFolder(str(root), transform=transform)
    return DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
        persistent_workers=args.workers > 0, drop_last=True,
    )  # fmt: skip


def kindling_datamodule(root: Path, args: argparse.Namespace, decode_device: str = "cpu"):
    augment = {
        "crop": v2.RandomCrop(args.image_size, padding=PADDING),
        "flip": v2.RandomHorizontalFlip(),
    }
    datamodule = ImageFolderDataModule(
        str(root), num_classes=args.classes, image_size=args.image_size,
        batch_size=args.batch_size, num_workers=args.workers, augment=augment,
        val_fraction=0.01, test_fraction=0.01, decode_device=decode_device,
    )  # fmt: skip
    datamodule.setup("fit")
    return datamodule


def augment_share(steps: int) -> dict[str, float]:
    """Per-batch device augmentation time as a share of a default-CNN training step."""
    torch.manual_seed(0)
    net = CNNClassifier([3, 32, 32], 10, channels=[32, 64], dropout=0.1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.003, weight_decay=0.01)
    images, labels = torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,))
    augment = BatchAugment(
        {"crop": v2.RandomCrop(32, padding=PADDING), "flip": v2.RandomHorizontalFlip()}
    )
    generator = torch.Generator().manual_seed(0)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(images), labels).backward()
        optimizer.step()

    def timed(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    step_s = timed(step)
    augment_s = timed(lambda: augment(images, generator, -1.0))
    return {"step_ms": step_s * 1e3, "augment_ms": augment_s * 1e3, "share": augment_s / step_s}


def loader_arguments(description: str) -> argparse.ArgumentParser:
    """The files, loader and repeats a loader benchmark takes (this one and streaming.py)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--file-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    return parser


def main() -> None:
    parser = loader_arguments(__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    result: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "images"
        write_files(root, args.images, args.classes, args.file_size)
        datamodule = kindling_datamodule(root, args)
        mean, std = datamodule.mean.flatten().tolist(), datamodule.std.flatten().tolist()
        kindling = datamodule.train_dataloader()
        plain = plain_loader(root, args, mean, std)
        sides = {"plain": [], "kindling": []}
        for repeat in range(args.repeats):
            for side in ("plain", "kindling") if repeat % 2 == 0 else ("kindling", "plain"):
                loader = plain if side == "plain" else kindling
                finish = (lambda b: b) if side == "plain" else (
                    lambda b: datamodule.on_after_batch_transfer(b, 0))  # fmt: skip
                sides[side].append(images_per_second(loader, finish))
                print(f"repeat {repeat} {side:<8} {sides[side][-1]:8.0f} images/s")
        ratios = sorted(k / p for k, p in zip(sides["kindling"], sides["plain"], strict=True))
        result["loader"] = {
            side: statistics.median(values) for side, values in sides.items()
        } | {"ratio_median": statistics.median(ratios), "ratio_min": ratios[0],
             "ratio_max": ratios[-1]}  # fmt: skip
        loader = result["loader"]
        print(
            f"\nloader, {args.images} JPEG files {args.file_size}px -> {args.image_size}px, "
            f"crop+flip, batch {args.batch_size}, {args.workers} workers:\n"
            f"  plain ImageFolder+DataLoader {loader['plain']:8.0f} images/s\n"
            f"  kindling image_folder        {loader['kindling']:8.0f} images/s\n"
            f"  kindling / plain: {loader['ratio_median']:.2f} "
            f"(min {loader['ratio_min']:.2f}, max {loader['ratio_max']:.2f})"
        )

        if torch.cuda.is_available():
            gpu = kindling_datamodule(root, args, decode_device="cuda")
            device = torch.device("cuda")
            gpu.trainer = type("T", (), {"training": True})()
            gpu.trainer.strategy = type("S", (), {"root_device": device})()

            def decode(batch):
                images, labels = gpu.on_before_batch_transfer(batch, 0)
                out = gpu.on_after_batch_transfer((images, labels), 0)
                torch.cuda.synchronize()
                return out

            rate = images_per_second(gpu.train_dataloader(), decode)
            result["gpu_decode_images_per_s"] = rate
            print(f"  kindling image_folder, decode_device=cuda: {rate:8.0f} images/s")
        else:
            print("  decode_device=cuda: skipped (CUDA is not available)")

    share = augment_share(args.steps)
    result["device_augment"] = share
    print(
        f"\ndevice augmentation (crop+flip, per image) at batch 512, 3x32x32, CPU:\n"
        f"  default CNN training step {share['step_ms']:.1f} ms, augmentation "
        f"{share['augment_ms']:.2f} ms: {share['share']:.1%} of a step"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loader.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
