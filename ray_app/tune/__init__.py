"""`kermt tune`: hyperparameter sweeps over finetune runs with Ray Tune."""
