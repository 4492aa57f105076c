"""Silence the warnings and notices every kindling run prints that ask nothing of the user."""

import logging
import warnings

# (message regex, category); the comment in each says why it does not help.
UNHELPFUL_WARNINGS = [
    (
        r".*does not have many workers.*",
        Warning,
        # kindling's data modules hold their tensors in memory; num_workers=0 is deliberate there
        # (workers only add start-up time) and is set per data set in configs/data/.
    ),
    (
        r".*The number of training batches \(\d+\) is smaller than the logging interval.*",
        Warning,
        # Metrics are logged per epoch (on_step=False); the step interval does not matter.
    ),
    (
        r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
        FutureWarning,
        # Raised inside Lightning's own code against newer torch; nothing to change in ours.
    ),
    (
        r".*__array__ implementation doesn't accept a copy keyword.*",
        DeprecationWarning,
        # matplotlib converting the tensor torchmetrics' confusion-matrix plot hands it.
    ),
    (
        r".*'set_vital' is deprecated.*",
        UserWarning,
        # torchdata's StatefulDataLoader calls it on every loader it makes; nothing to change.
    ),
]


class _DropAdvertisement(logging.Filter):
    """Lightning logs a tip to install its cloud logger at every Trainer start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def ignore_unhelpful_warnings() -> None:
    """Filter the known unhelpful warnings; helpful ones (e.g. about DistributedSampler during
    test) still show. Safe to call more than once."""
    for message, category in UNHELPFUL_WARNINGS:
        # warnings.filterwarnings replaces an identical filter rather than adding a second one.
        warnings.filterwarnings("ignore", message=message, category=category)
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropAdvertisement) for f in rank_zero_logger.filters):
        rank_zero_logger.addFilter(_DropAdvertisement())
