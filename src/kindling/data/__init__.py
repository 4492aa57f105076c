"""LightningDataModules: one file per family of data sets."""
