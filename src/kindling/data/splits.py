"""Every data set's train/val/test split: seeded, stratified where asked, or k-fold."""

import torch

from kindling.config.errors import UserError


def check_folds(folds: int | None, fold: int | None) -> None:
    """Refuse a fold setting that picks no single validation fold (`data.folds`, `data.fold`)."""
    if folds is None and fold is None:
        return
    if folds is None:
        raise UserError(f"data.fold={fold} needs the number of folds: add data.folds=K (e.g. 5).")
    if folds < 2:
        raise UserError(
            f"data.folds={folds}: cross-validation needs a whole number of folds, >= 2."
        )
    last = folds - 1
    if fold is None:
        raise UserError(
            f"data.folds={folds} needs the validation fold: data.fold=0..{last} "
            f"(all of them: -m data.fold={','.join(map(str, range(folds)))})."
        )
    if not 0 <= fold < folds:
        raise UserError(f"data.fold={fold} is out of range for data.folds={folds}: use 0..{last}.")


def fold_split(
    labels: torch.Tensor, folds: int, fold: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(train, val)` indices into `labels`: val is fold `fold` of `folds`, train the others.

    Shuffled with `seed`, grouped by class and dealt out in turn: the folds are disjoint, cover
    every sample, and differ in size, and in each class's count, by at most one (stratified).
    """
    check_folds(folds, fold)
    if len(labels) < folds:
        raise UserError(f"Only {len(labels)} training samples: too few for data.folds={folds}.")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    by_class = order[torch.sort(labels[order], stable=True).indices]
    assigned = torch.empty(len(labels), dtype=torch.long)
    assigned[by_class] = torch.arange(len(labels)) % folds
    return (assigned != fold).nonzero().squeeze(1), (assigned == fold).nonzero().squeeze(1)


def split_off(
    labels: torch.Tensor,
    fraction: float,
    seed: int,
    *,
    folds: int | None = None,
    fold: int | None = None,
    stratify: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rest, held out)` indices into `labels`, each ascending: fold `fold` of `folds` when
    given (`fold_split`), else a seeded `fraction` of the samples (at least one); `stratify`
    keeps each class's share, as fold 0 of `round(1 / fraction)` folds does."""
    if folds is not None:
        return fold_split(labels, folds, fold, seed)
    count = len(labels)
    if stratify:
        return fold_split(labels, max(2, min(round(1 / fraction), count)), 0, seed)
    held = max(1, round(count * fraction))
    if held >= count:
        raise UserError(
            f"Only {count} training samples: too few to hold out {fraction:.0%} of them. Add "
            "samples, or give the split of your own."
        )
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return order[held:].sort().values, order[:held].sort().values
