"""`plain_train.py` through a bare Lightning Trainer: the floor any Lightning script pays.

The same split, net, optimizer, schedule, batch size and epochs as `plain_train.py`, in a
minimal LightningModule; the Trainer has no logger, progress bar or model summary, and one
ModelCheckpoint that keeps the last epoch and the best validation accuracy, as the plain script
does. It validates every epoch and tests the best checkpoint at the end. `benchmarks/process.py`
times it as the "lightning" side, between the plain script and `python train.py`.

    python benchmarks/lightning_train.py --epochs 10
"""

import time

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from plain_train import data_loaders, parse_args

from kindling.models.cnn import CNNClassifier


class BareClassifier(L.LightningModule):
    def __init__(self, image_shape: tuple[int, ...], epochs: int) -> None:
        super().__init__()
        self.net = CNNClassifier(image_shape=image_shape, num_classes=10, channels=[32, 64])
        self.epochs = epochs

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx) -> None:
        x, y = batch
        self.log("val/acc", (self.net(x).argmax(1) == y).float().mean())

    def test_step(self, batch, batch_idx) -> None:
        x, y = batch
        self.log("test/acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.003, weight_decay=0.01)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.epochs)
        return [optimizer], [scheduler]


def main() -> None:
    args = parse_args("lightning_run")
    start = time.perf_counter()
    torch.manual_seed(12345)
    train_loader, val_loader, test_loader = data_loaders(args)
    module = BareClassifier(tuple(train_loader.dataset.tensors[0].shape[1:]), args.epochs)
    trainer = L.Trainer(
        max_epochs=args.epochs, default_root_dir=args.out, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(args.out, monitor="val/acc", mode="max", save_last=True)],
    )  # fmt: skip
    trainer.fit(module, train_loader, val_loader)
    (result,) = trainer.test(module, test_loader, ckpt_path="best", verbose=False)
    print(f"test/acc {result['test/acc']:.4f}")
    print(f"seconds {time.perf_counter() - start:.2f}")


if __name__ == "__main__":
    main()
