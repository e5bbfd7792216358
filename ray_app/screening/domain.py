"""`kermt predict / eval --applicability_domain`: the index of the ensemble's first fold, found and checked before
Ray starts, then fitted once per model actor.

The index travels to the actors with the members: Ray Data puts a stage's constructor arguments in the object store
once, and each actor reads them once, in its constructor, where it also fits the scikit-learn index; a block costs
member 0's encoder pass and one k-NN query (kermt.uncertainty.domain). With several folds, predict's ensemble is
every fold's members but the domain is fold 0's (its member 0's embedding, its training split): the one index whose
embedding the actor computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from kermt.checkpoint import Checkpoint, load_finetune_model
from kermt.data.featurize import FeaturizedMolecules
from kermt.errors import UserError
from kermt.uncertainty.domain import (DOMAIN_FILE, DomainIndex, DomainSearch, embedding_identity, load_domain,
                                      model_embeddings)
from ray_app.common.columns import DISTANCE_COLUMN, IN_DOMAIN_COLUMN
from ray_app.screening.config import ModelScreeningConfig, log

FLAG = "--applicability_domain"
HOW_TO_GET_ONE = ("train it again with this kermt: `kermt finetune` saves each fold's applicability domain "
                  f"(fold_k/{DOMAIN_FILE}, from its train and validation splits)")


def plan_domain(config: ModelScreeningConfig, members: list[Checkpoint]) -> DomainIndex | None:
    """The index of members[0]'s fold when the flag is given (an error if it has none or it is another model's)."""
    if not config.applicability_domain:
        return None
    if config.checkpoint_dir is None:
        raise UserError(f"{FLAG} needs the finetune run: pass --checkpoint_dir with its --save_dir (each fold_k/ "
                        f"holds {DOMAIN_FILE}), not --checkpoint_path of one member")
    fold = fold_directory(Path(config.checkpoint_dir), members[0].path)
    if fold is None:
        raise UserError(f"{FLAG}: --checkpoint_dir {config.checkpoint_dir} has no applicability domain (no "
                        f"{DOMAIN_FILE} beside its first member {members[0].path}): it was trained before the "
                        f"domain existed; {HOW_TO_GET_ONE}")
    index = load_domain(str(fold))
    model, _ = load_finetune_model(members[0])  # the weights the actors embed with (a file may hold unbuilt ones)
    if index.identity != embedding_identity(model.state_dict()):
        raise UserError(f"{FLAG}: {fold / DOMAIN_FILE} was built from another model than {members[0].path} (the "
                        f"weights' sha256 differs: a stale file); {HOW_TO_GET_ONE}")
    log(f"applicability domain: {fold / DOMAIN_FILE}, {index.training.shape[0]} of {index.n_training_total} "
        f"training molecule(s), k={index.k}, in_domain = domain_distance <= {index.threshold:.4g} (as close as "
        f"{index.quantile:.0%} of the validation molecules)")
    return index


def fold_directory(root: Path, first_member: Path) -> Path | None:
    """The directory holding the domain of ``first_member`` (``fold_k/model_0/model``): its fold, or ``root``."""
    for candidate in (first_member.parent.parent, root):
        if (candidate / DOMAIN_FILE).is_file():
            return candidate
    return None


class DomainColumns:
    """In a predict actor: the fitted index and the model whose embedding it reads (built once per actor)."""

    def __init__(self, index: DomainIndex, model, device) -> None:
        self.search, self.model, self.device = DomainSearch(index), model, device

    def __call__(self, molecules: FeaturizedMolecules, batch_size: int) -> dict[str, pa.Array]:
        distances = self.search.distances(model_embeddings(self.model, molecules, batch_size, self.device))
        valid = molecules.valid
        return {DISTANCE_COLUMN: pa.array(distances, pa.float64(), mask=~valid),
                IN_DOMAIN_COLUMN: pa.array(self.search.index.in_domain(np.nan_to_num(distances, nan=np.inf)),
                                           pa.bool_(), mask=~valid)}


__all__ = ["DISTANCE_COLUMN", "DomainColumns", "IN_DOMAIN_COLUMN", "fold_directory", "plan_domain"]
