"""Loggers Lightning does not already provide."""
