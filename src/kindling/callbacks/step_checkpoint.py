"""last.ckpt every N optimizer steps: a callback only where N is set."""

from lightning.pytorch.callbacks import ModelCheckpoint


def step_checkpoint(dirpath: str, every_n_train_steps: int | None = None) -> ModelCheckpoint | None:
    """A checkpoint callback overwriting `dirpath/last.ckpt` every `every_n_train_steps`
    optimizer steps (the epochs' last.ckpt is another callback's; never last-v1.ckpt, no other
    file). None where the interval is null or 0: Lightning calls every callback's hooks at every
    step, and a checkpoint callback's calls cost more than most."""
    if not every_n_train_steps:
        return None
    return ModelCheckpoint(
        dirpath=dirpath, every_n_train_steps=every_n_train_steps, every_n_epochs=0,
        save_top_k=0, save_last=True, enable_version_counter=False, verbose=False,
    )  # fmt: skip
