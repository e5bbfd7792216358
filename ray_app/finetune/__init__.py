"""`kermt finetune`: ensembles x folds of Ray Train runs (see run.py for the flow)."""
