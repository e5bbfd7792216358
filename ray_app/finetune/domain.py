"""The last step of a finetune fold, next to its calibration: the fold's applicability domain
(``fold_k/domain.json`` + ``fold_k/domain_embeddings.safetensors``, kermt.uncertainty.domain).

Member 0's embedding, not every member's: one member keeps `kermt predict --applicability_domain` at one extra
encoder pass per batch (an index per member would cost one pass and one k-NN query per member). Two members'
distances agree on what is far (93.5 % agree on in_domain on the demo test split) but rank the near molecules only
loosely alike (Spearman 0.58): docs/uncertainty.md. The training
molecules (a seeded subsample of at most 50,000) form the index; the validation molecules set the threshold; both
are read from the fold's shards a shard at a time, each validation shard embedded in the read that gives the
members' predictions of it (ray_app.finetune.after_training: :class:`FoldDomain`). Like
the calibration, a fold without enough validation molecules is reported in one line, never a failed run. The
files are written under save_dir, which is uploaded with the other fold files when --save_dir is a URI.
"""

from __future__ import annotations

from collections.abc import Callable

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


class FoldDomain:
    """A fold's domain from member 0, built in the reads of the fold's shards that the step after training makes
    anyway (ray_app.finetune.after_training): the index here, from the training molecules :func:`training_rows`
    keeps, picked as each train shard goes by; then :meth:`distances` of each validation shard, as the members
    predict it (and of the test and calibration molecules, for a calibration that conditions on them); then
    :meth:`finish` with the validation distances: the threshold, ``fold_k/domain.json`` and one line. ``rule``: the
    run's width rule, the one predict reads the embedding with."""

    def __init__(self, setup: RunSetup, fold: int, data: FoldData, member0: KermtFinetuneModel,
                 rule: WidthRule | None = None):
        self.setup, self.fold, self.n_val = setup, fold, sum(data.val.manifest.rows)
        self._embed = _embedder(setup, member0, rule)
        n_train = sum(data.train.manifest.rows)
        try:
            self.index: DomainIndex | None = fit_index(
                _training_embeddings(data, self._embed), self.n_val, embedding_identity(member0.state_dict()),
                n_training_total=n_train,
                source=f"{fold_name(fold)} member 0: train split (index), validation split (threshold)")
            self.error = ""
        except ValueError as error:  # too few molecules: reported by finish, with the threshold's reason
            self.index, self.error = None, str(error)
        self._search = None if self.index is None else DomainSearch(self.index)

    def distances(self, molecules: MoleculeSet) -> np.ndarray:
        """float64 [n]: each molecule's ``domain_distance`` as `kermt predict` computes it (needs the index)."""
        assert self._search is not None, "FoldDomain.distances needs a fitted index"
        return self._search.distances(self._embed(molecules))

    def finish(self, val_distances: np.ndarray | None) -> DomainIndex | None:
        """The index with the threshold the validation molecules' distances set, saved (``val_distances``: None
        only when there is no index); None, with the reason in one line, when there are too few molecules."""
        index = None
        if self.index is not None:
            try:
                index = with_threshold(self.index, val_distances)
            except ValueError as error:
                self.error = str(error)
        if index is None:
            print(f"fold {self.fold}: no applicability domain ({self.error}); predict --applicability_domain needs "
                  "one", flush=True)
            return None
        save_domain(str(self.setup.layout.fold(self.fold)), index)
        print(f"fold {self.fold}: applicability domain ({DOMAIN_FILE}): {index.training.shape[0]} training "
              f"molecule(s), k={index.k}, threshold {index.threshold:.4g} = the {index.quantile:.0%} quantile of "
              f"{self.n_val} validation molecules' distances", flush=True)
        return index


def _training_embeddings(data: FoldData, embed: Callable[[MoleculeSet], np.ndarray]) -> np.ndarray:
    """[n, D] embeddings of the training rows :func:`training_rows` keeps, picked as each train shard goes by."""
    kept, offset, parts = training_rows(sum(data.train.manifest.rows)), 0, []
    for shard in data.train.sets():
        mine = kept[(kept >= offset) & (kept < offset + len(shard))] - offset
        if len(mine):
            parts.append(embed(shard.take(mine)))
        offset += len(shard)
    return np.concatenate(parts) if parts else np.zeros((0, 0))


def _embedder(setup: RunSetup, member0: KermtFinetuneModel, rule: WidthRule | None) \
        -> Callable[[MoleculeSet], np.ndarray]:
    c = setup.config
    return lambda molecules: split_embeddings(member0, _featurized(molecules), c.step_batch_size, c.use_gpu, rule)


__all__ = ["FoldDomain", "split_embeddings"]
