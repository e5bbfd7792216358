"""The last step of a finetune fold, next to its calibration: the fold's applicability domain
(``fold_k/domain.json`` + ``fold_k/domain_embeddings.safetensors``, kermt.uncertainty.domain).

Member 0's embedding, not every member's: one member keeps `kermt predict --applicability_domain` at one extra
encoder pass per batch (an index per member would cost one pass and one k-NN query per member). Two members'
distances agree on what is far (93.5 % agree on in_domain on the demo test split) but rank the near molecules only
loosely alike (Spearman 0.58): docs/uncertainty.md. The training
molecules (a seeded subsample of at most 50,000) form the index; the validation molecules set the threshold. Like
the calibration, a fold without enough validation molecules is reported in one line, never a failed run. The
files are written under save_dir, which is uploaded with the other fold files when --save_dir is a URI.
"""

from __future__ import annotations

import numpy as np
import ray
import torch

from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import FeaturizedMolecules
from kermt.inference.widths import WidthRule
from kermt.nn.finetune import KermtFinetuneModel
from kermt.run_layout import DOMAIN_FILE, fold_name
from kermt.uncertainty.domain import (DomainIndex, DomainSearch, embedding_identity, fit_domain, model_embeddings,
                                      save_domain, training_rows)
from ray_app.finetune.prepare import ScaledSplits
from ray_app.finetune.run_setup import RunSetup


def _featurized(molecules: MoleculeSet) -> FeaturizedMolecules:
    """A split as inference reads it: every row valid; no features (the embedding is read out before them)."""
    n = len(molecules)
    return FeaturizedMolecules(smiles=molecules.smiles, reasons=(None,) * n, graphs=molecules.graphs,
                               features=np.zeros((n, 0)))


def split_embeddings(model: KermtFinetuneModel, molecules: FeaturizedMolecules, batch_size: int,
                     use_gpu: bool, rule: WidthRule | None = None) -> np.ndarray:
    """[n, D] embeddings of a split (``rule``: the run's width rule, as predict reads them); with ``use_gpu`` by a
    task on a GPU node (as the test predictions are)."""
    if use_gpu and len(molecules):
        return ray.get(_embed_on_gpu.remote(model, molecules, batch_size, rule))
    return model_embeddings(model, molecules, batch_size, rule=rule)


@ray.remote(num_gpus=1)
def _embed_on_gpu(model: KermtFinetuneModel, molecules: FeaturizedMolecules, batch_size: int,
                  rule: WidthRule | None) -> np.ndarray:
    return model_embeddings(model.to(torch.device("cuda")), molecules, batch_size, "cuda", rule)


def write_fold_domain(setup: RunSetup, fold: int, splits: ScaledSplits, member0: KermtFinetuneModel,
                      rule: WidthRule | None = None) -> DomainIndex | None:
    """Fit and save the fold's domain from member 0 (one line says what, or why not) and return it; ``rule``: the
    run's width rule, the one predict reads the embedding with."""
    c = setup.config
    kept = _featurized(splits.train).select(training_rows(len(splits.train)))  # only the index's molecules
    train, val = (split_embeddings(member0, part, c.step_batch_size, c.use_gpu, rule)
                  for part in (kept, _featurized(splits.val)))
    try:
        index = fit_domain(train, val, embedding_identity(member0.state_dict()), n_training_total=len(splits.train),
                           source=f"{fold_name(fold)} member 0: train split (index), validation split (threshold)")
    except ValueError as error:
        print(f"fold {fold}: no applicability domain ({error}); predict --applicability_domain needs one",
              flush=True)
        return None
    save_domain(str(setup.layout.fold(fold)), index)
    print(f"fold {fold}: applicability domain ({DOMAIN_FILE}): {index.training.shape[0]} training molecule(s), "
          f"k={index.k}, threshold {index.threshold:.4g} = the {index.quantile:.0%} quantile of "
          f"{len(val)} validation molecules' distances", flush=True)
    return index


def domain_distances(setup: RunSetup, index: DomainIndex | None, molecules: MoleculeSet,
                     member0: KermtFinetuneModel, rule: WidthRule | None = None) -> np.ndarray | None:
    """float64 [n]: each of ``molecules``' ``domain_distance`` as `kermt predict` computes it (member 0's
    embedding, the fold's index), for a calibration that conditions on it; None without an index."""
    if index is None:
        return None
    c = setup.config
    return DomainSearch(index).distances(split_embeddings(member0, _featurized(molecules), c.step_batch_size,
                                                          c.use_gpu, rule))


__all__ = ["domain_distances", "split_embeddings", "write_fold_domain"]
