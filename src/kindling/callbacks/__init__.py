"""Callbacks Lightning does not already provide. The default set is built from Lightning's own."""
