"""k-fold cross-validation (`data.folds`, `data.fold`) and stratified hold-outs: the settings'
check and the seeded, stratified split (imported only where folds or stratification are asked)."""

import torch

from kindling.errors import UserError


def check_folds(folds: int | None, fold: int | None) -> None:
    """Refuse a fold setting that picks no single validation fold (`data.folds`, `data.fold`)."""
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
    if len(labels) < folds:
        raise UserError(f"Only {len(labels)} training samples: too few for data.folds={folds}.")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    by_class = order[torch.sort(labels[order], stable=True).indices]
    assigned = torch.empty(len(labels), dtype=torch.long)
    assigned[by_class] = torch.arange(len(labels)) % folds
    return (assigned != fold).nonzero().squeeze(1), (assigned == fold).nonzero().squeeze(1)
