"""Loggers Lightning does not already provide."""

from kindling.loggers.resumable_csv import ResumableCSVLogger

__all__ = ["ResumableCSVLogger"]
