"""The script a user writes by hand: the reference for `benchmarks/process.py`.

Trains what `python train.py` trains, the plain way: the same split and standardisation, CNN,
AdamW and cosine schedule, batch size and epochs; validates every epoch, saves a checkpoint
every epoch and tests the best one at the end. `--data digits` is the default experiment;
`--data mnist` reads MNIST's IDX files from `<data-dir>/MNIST/raw/` as `data=mnist` does.

    python benchmarks/plain_train.py --epochs 10 --out /tmp/plain
    python benchmarks/plain_train.py --data mnist --data-dir data --batch-size 128 --epochs 2
"""

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from kindling.models.cnn import CNNClassifier


def standardised(images, labels, train, val, test_images, test_labels):
    mean, std = images[train].mean(), images[train].std()
    return [
        ((images[train] - mean) / std, labels[train]),
        ((images[val] - mean) / std, labels[val]),
        ((test_images - mean) / std, test_labels),
    ]


def mnist_splits(data_dir: Path, val_fraction: float = 0.1):
    from torchvision.datasets import MNIST

    train_set, test_set = (MNIST(data_dir, train=t, download=False) for t in (True, False))
    images = train_set.data.unsqueeze(1).float() / 255.0
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    num_val = round(len(order) * val_fraction)
    val, train = order[:num_val], order[num_val:]
    test_images = test_set.data.unsqueeze(1).float() / 255.0
    return standardised(images, train_set.targets, train, val, test_images, test_set.targets)


def digits_splits(val_fraction: float = 0.1, test_fraction: float = 0.2):
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    num_test = round(len(order) * test_fraction)
    test, rest = order[:num_test], order[num_test:]
    rest = rest[torch.randperm(len(rest), generator=torch.Generator().manual_seed(0))]
    num_val = round(len(rest) * val_fraction)
    val, train = rest[:num_val], rest[num_val:]
    return standardised(images, labels, train, val, images[test], labels[test])


def evaluate(net, loader, device) -> float:
    net.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (net(x).argmax(1) == y).sum().item()
            total += len(y)
    return correct / total


def parse_args(default_out: str) -> argparse.Namespace:
    """The command line of this script and of `lightning_train.py`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", choices=["digits", "mnist"], default="digits")
    parser.add_argument("--data-dir", type=Path, default=Path("data"))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(default_out))
    return parser.parse_args()


def data_loaders(args: argparse.Namespace) -> list[DataLoader]:
    """Train (shuffled), validation and test loaders of the data set `args` names."""
    train, val, test = digits_splits() if args.data == "digits" else mnist_splits(args.data_dir)
    return [
        DataLoader(TensorDataset(*split), batch_size=args.batch_size, shuffle=shuffle)
        for split, shuffle in ((train, True), (val, False), (test, False))
    ]


def main() -> None:
    args = parse_args("plain_run")
    start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(12345)
    loaders = data_loaders(args)
    image_shape = tuple(loaders[0].dataset.tensors[0].shape[1:])
    net = CNNClassifier(image_shape=image_shape, num_classes=10, channels=[32, 64]).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.003, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    args.out.mkdir(parents=True, exist_ok=True)
    best = -1.0
    for epoch in range(args.epochs):
        net.train()
        for x, y in loaders[0]:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        scheduler.step()
        accuracy = evaluate(net, loaders[1], device)
        state = {"net": net.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        torch.save(state, args.out / "last.pt")
        if accuracy > best:
            best = accuracy
            torch.save(state, args.out / "best.pt")
        print(f"epoch {epoch} val/acc {accuracy:.3f}")
    net.load_state_dict(torch.load(args.out / "best.pt", weights_only=True)["net"])
    print(f"test/acc {evaluate(net, loaders[2], device):.4f}")
    print(f"seconds {time.perf_counter() - start:.2f}")


if __name__ == "__main__":
    main()
