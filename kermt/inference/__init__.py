"""Inference with trained checkpoints: ensembles of finetuned members, fingerprints and embeddings (pure torch).

The runners (``ray_app.screening``, a notebook) hand this module featurised molecules; everything that decides a
number lives here:

* :func:`find_checkpoints` picks the best model of every member under a finetune output directory (never
  ``last_checkpoint.pt`` or Ray Train's ``training_state.pt``).
* :func:`plan_features` checks, before anything is predicted, that the molecule features given for prediction are
  the ones every member was trained with (generator, width) and picks the checkpoint's own generator when the user
  named none. Each member scales features and de-scales targets with its OWN scalers.
* :class:`Ensemble` predicts a block of molecules in **batches of ``batch_size`` consecutive rows**. Upstream's
  numbers depend on which molecules share a batch (the padding row takes part in neighbour sums,
  docs/numerics.md#batch-composition), so a batch is always "the valid molecules among rows [k·B, (k+1)·B) of the
  block"; given blocks that start at a multiple of B, results depend only on the input order and B, never on how the
  work was spread.
* :class:`Embedder` gives the mean readouts of the encoder's embedding families (upstream's fingerprints and
  ``extract_embeddings``) and, for cMIM/hybrid checkpoints, the projected latent mean.
* :func:`kermt.inference.shared.predict_blocks` predicts several blocks (a service's requests) in shared
  forwards, each block still getting the numbers of the batch rule applied to it alone.
* Ensembles and embedders feed the device through :func:`run_batches` (:mod:`kermt.inference.batches`): each
  batch collated with the model's neighbour-sum operators by a background thread, batch k + 1 launched before
  batch k is read back.
"""

from kermt.inference.batches import InferenceBatch, atom_budget_starts, batch_starts, run_batches, valid_batches
from kermt.inference.embed import FAMILIES, Embedder
from kermt.inference.ensemble import Ensemble, EnsemblePrediction
from kermt.inference.features import FeatureMismatchError, FeaturePlan, describe_expected, plan_features, scale_features
from kermt.inference.members import find_checkpoints, read_members, task_names

__all__ = [
    "FAMILIES", "Embedder", "Ensemble", "EnsemblePrediction", "FeatureMismatchError", "FeaturePlan", "InferenceBatch",
    "atom_budget_starts", "batch_starts", "describe_expected", "find_checkpoints", "plan_features", "read_members",
    "run_batches", "scale_features", "task_names", "valid_batches",
]
