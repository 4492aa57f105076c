"""Silence the warnings and notices every kindling run prints that ask nothing of the user."""

import logging
import os
import warnings

# (message regex, category), and why it does not help.
UNHELPFUL_WARNINGS = [
    # kindling's in-memory data sets take num_workers=0 on purpose (workers only add start-up).
    (r".*does not have many workers.*", Warning),
    # Metrics are logged per epoch (on_step=False): the step interval does not matter.
    (r".*The number of training batches \(\d+\) is smaller than the logging interval.*", Warning),
    # Raised inside Lightning's own code against newer torch.
    (r".*isinstance\(treespec, LeafSpec\)` is deprecated.*", FutureWarning),
    # matplotlib converting the tensor of torchmetrics' confusion-matrix plot.
    (r".*__array__ implementation doesn't accept a copy keyword.*", DeprecationWarning),
    # torchdata's StatefulDataLoader calls it on every loader it makes.
    (r".*'set_vital' is deprecated.*", UserWarning),
]
# Lightning's notices at every Trainer start, and LitData's for every streamed split and worker,
# that say nothing to this run.
UNHELPFUL_NOTICES = (
    "litlogger",  # a tip to install Lightning's cloud logger
    "litmodels",  # and its model registry
    "Trainer already configured with model summary callbacks",  # RichModelSummary is the one
    "was configured so 100% of the batches",  # `limit_*_batches: 1.0`: "all", spelled out
    "max_cache_size is unset",  # the local cache LitData allows itself, per split and worker
)
NOTICE_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "litdata.utilities.format")


def _no_notice(record: logging.LogRecord) -> bool:
    return not any(notice in record.getMessage() for notice in UNHELPFUL_NOTICES)


def ignore_unhelpful_warnings() -> None:
    """Filter the known unhelpful warnings; helpful ones (e.g. about DistributedSampler during
    test) still show. Safe to call more than once: equal warning filters replace each other."""
    for message, category in UNHELPFUL_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    if "SLURM_JOB_ID" not in os.environ:
        # Lightning's hint to start with srun, on any machine with SLURM's commands: it helps
        # inside an allocation only (kindling's SLURM launcher runs srun itself).
        warnings.filterwarnings("ignore", message=r".*The `srun` command is available.*")
    # Added once, however often it is called: addFilter skips a filter it already has.
    for name in NOTICE_LOGGERS:
        logging.getLogger(name).addFilter(_no_notice)
