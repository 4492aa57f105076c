"""Silence the warnings and notices every kindling run prints that ask nothing of the user."""

import logging
import os
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


# Lightning's notices at every Trainer start that say nothing to this run.
UNHELPFUL_NOTICES = (
    "litlogger",  # a tip to install Lightning's cloud logger
    "litmodels",  # and its model registry
    # kindling's RichModelSummary is the summary; Lightning says it adds none of its own.
    "Trainer already configured with model summary callbacks",
    # `limit_*_batches: 1.0`, configs/trainer/default.yaml's explicit "all of them".
    "was configured so 100% of the batches",
)


class _DropNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(notice in message for notice in UNHELPFUL_NOTICES)


def ignore_unhelpful_warnings() -> None:
    """Filter the known unhelpful warnings; helpful ones (e.g. about DistributedSampler during
    test) still show. Safe to call more than once."""
    for message, category in UNHELPFUL_WARNINGS:
        # warnings.filterwarnings replaces an identical filter rather than adding a second one.
        warnings.filterwarnings("ignore", message=message, category=category)
    if "SLURM_JOB_ID" not in os.environ:
        # Lightning's hint to start with srun, on every machine that has SLURM's commands: it
        # helps inside an allocation only (kindling's SLURM launcher runs srun itself).
        warnings.filterwarnings("ignore", message=r".*The `srun` command is available.*")
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropNotices) for f in rank_zero_logger.filters):
        rank_zero_logger.addFilter(_DropNotices())
