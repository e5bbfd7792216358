"""The pretraining model: the encoder with GROVER's vocabulary heads, the cMIM latent head and the SMILES decoder
(configuration, heads, decoder layers, and generation from a latent)."""
