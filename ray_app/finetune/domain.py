"""The last step of a finetune fold, next to its calibration: the fold's applicability domain
(``fold_k/domain.json`` + ``fold_k/domain_embeddings.safetensors``, kermt.uncertainty.domain).

Member 0's embedding, not every member's: one member keeps `kermt predict --applicability_domain` at one extra
encoder pass per batch (an index per member would cost one pass and one k-NN query per member). Two members'
distances agree on what is far (93.5 % agree on in_domain on the demo test split) but rank the near molecules only
loosely alike (Spearman 0.58): docs/uncertainty.md. The training
molecules (a seeded subsample of at most 50,000) form the index; the validation molecules set the threshold; both
are read from the fold's shards a shard at a time (ray_app.finetune.after_training). Like
the calibration, a fold without enough validation molecules is reported in one line, never a failed run. The
files are written under save_dir, which is uploaded with the other fold files when --save_dir is a URI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import ray
import torch

from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import FeaturizedMolecules
from kermt.inference.widths import WidthRule
from kermt.nn.finetune import KermtFinetuneModel
from kermt.run_layout import DOMAIN_FILE, fold_name
from kermt.uncertainty.domain import (DomainIndex, DomainSearch, embedding_identity, fit_index, model_embeddings,
                                      save_domain, training_rows, with_threshold)
from ray_app.finetune.fold_data import FoldData
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


def write_fold_domain(setup: RunSetup, fold: int, data: FoldData, member0: KermtFinetuneModel,
                      rule: WidthRule | None = None) -> DomainIndex | None:
    """Fit and save the fold's domain from member 0 (one line says what, or why not) and return it; ``rule``: the
    run's width rule, the one predict reads the embedding with. Read from the fold's shards a shard at a time: the
    index from the training molecules :func:`training_rows` keeps, picked as each train shard goes by, then the
    threshold from the validation molecules' distances, computed shard by shard."""
    n_train, n_val = sum(data.train.manifest.rows), sum(data.val.manifest.rows)
    embed = _embedder(setup, member0, rule)
    kept, offset, parts = training_rows(n_train), 0, []
    for shard in data.train.sets():
        mine = kept[(kept >= offset) & (kept < offset + len(shard))] - offset
        if len(mine):
            parts.append(embed(shard.take(mine)))
        offset += len(shard)
    try:
        index = fit_index(np.concatenate(parts) if parts else np.zeros((0, 0)), n_val,
                          embedding_identity(member0.state_dict()), n_training_total=n_train,
                          source=f"{fold_name(fold)} member 0: train split (index), validation split (threshold)")
        index = with_threshold(index, _distances(index, data.val.sets(), embed))
    except ValueError as error:
        print(f"fold {fold}: no applicability domain ({error}); predict --applicability_domain needs one",
              flush=True)
        return None
    save_domain(str(setup.layout.fold(fold)), index)
    print(f"fold {fold}: applicability domain ({DOMAIN_FILE}): {index.training.shape[0]} training molecule(s), "
          f"k={index.k}, threshold {index.threshold:.4g} = the {index.quantile:.0%} quantile of "
          f"{n_val} validation molecules' distances", flush=True)
    return index


def domain_distances(setup: RunSetup, index: DomainIndex | None, parts: Iterable[MoleculeSet],
                     member0: KermtFinetuneModel, rule: WidthRule | None = None) -> np.ndarray | None:
    """float64 [n]: the ``domain_distance`` of each molecule of ``parts`` (a split's shards, in order) as
    `kermt predict` computes it (member 0's embedding, the fold's index), for a calibration that conditions on it;
    None without an index."""
    if index is None:
        return None
    return _distances(index, parts, _embedder(setup, member0, rule))


def _embedder(setup: RunSetup, member0: KermtFinetuneModel, rule: WidthRule | None) \
        -> Callable[[MoleculeSet], np.ndarray]:
    c = setup.config
    return lambda molecules: split_embeddings(member0, _featurized(molecules), c.step_batch_size, c.use_gpu, rule)


def _distances(index: DomainIndex, parts: Iterable[MoleculeSet], embed: Callable[[MoleculeSet], np.ndarray]) \
        -> np.ndarray:
    search = DomainSearch(index)
    return np.concatenate([search.distances(embed(part)) for part in parts] or [np.zeros(0)])


__all__ = ["domain_distances", "split_embeddings", "write_fold_domain"]
