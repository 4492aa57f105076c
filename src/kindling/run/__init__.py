"""The record and place of a run: its folder, its provenance, where a resumed run continues, what
a multirun's jobs leave, and how the ranks of a multi-device job are launched under Hydra."""

# A run folder's newest checkpoint, relative to the folder: every epoch's end (the callback
# `last_checkpoint`, configs/callbacks/model_checkpoint.yaml) and an interrupt write it.
LAST_CHECKPOINT = "checkpoints/last.ckpt"
