"""Finetuning without Ray: the two-view loss, the optimiser and its schedule, the training step, and the member loop
(epochs, validation, best epoch, early stopping) over a communicator: one process, plain torch.distributed
processes, or Ray Train's workers (``ray_app/finetune/train_loop.py``)."""
