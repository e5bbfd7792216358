"""Finetuning math on one process: the two-view loss, the optimiser and its schedule, and the training step."""
