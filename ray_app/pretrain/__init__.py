"""`kermt corpus` (prepare a pretraining corpus with Ray Data) and `kermt pretrain` (pretrain on Ray Train)."""
