"""The record and place of a run: its folder, its provenance, where a resumed run continues, what
a multirun's jobs leave, and how the ranks of a multi-device job are launched under Hydra."""
