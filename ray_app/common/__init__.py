"""Pieces every Ray job shares: connecting to the cluster, storage, concurrency, outputs, settings, errors."""
