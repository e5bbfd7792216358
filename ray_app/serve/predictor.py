"""Model replicas: the ensemble loaded once per replica, requests batched across clients with ``@serve.batch``.

A batch is the requests that arrived within ``batch_wait_timeout_s`` (at most ``max_batch_size`` of them). How
their molecules share forwards follows the batch rule of `kermt predict` (:mod:`kermt.inference`), so a client's
numbers never depend on what other clients sent:

* ``zero`` padding (each molecule independent of its batch mates): all molecules of the batch go through one
  ``Ensemble.predict`` in forwards of ``batch_size`` molecules;
* ``upstream`` padding (a molecule's output depends on its batch's largest atom degree,
  docs/numerics.md#batch-composition): each request is its own block, cut into forwards of ``batch_size``
  consecutive molecules, exactly as `kermt predict --batch_size B` cuts a file holding that request's SMILES.

Featurisation (RDKit) runs in the replica; an invalid SMILES is its own entry with RDKit's reason, never an error.
``"domain": true`` adds ``domain_distance``/``in_domain`` from the index fitted once, in the replica's constructor
(:class:`ray_app.screening.domain.DomainColumns`, the code of `kermt predict --applicability_domain`);
``"embed": true`` adds ``embedding``, member 0's readout (:mod:`ray_app.serve.embedding`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
from ray import serve

from kermt.data.featurize import featurize_smiles
from kermt.inference import Ensemble
from kermt.uncertainty import Calibration, intervals
# <task>_std, <task>_lower/_upper: as `kermt predict --uncertainty --interval` names them
from ray_app.screening.domain import DISTANCE_COLUMN, IN_DOMAIN_COLUMN, DomainColumns
from ray_app.screening.stream import LOWER_SUFFIX, STD_SUFFIX, UPPER_SUFFIX
from ray_app.serve.embedding import EMBEDDING_COLUMN, MemberEmbedding
from ray_app.serve.models import ServedModel
from ray_app.serve.schemas import PredictJob


def _value(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def _interval_columns(tasks: Sequence[str], calibrations: dict[str, Calibration] | None, level: float | None,
                      mean: np.ndarray, std: np.ndarray) -> dict[str, np.ndarray]:
    """<task>_lower/<task>_upper for the block (the library call of `kermt predict --interval`), or nothing."""
    if level is None or calibrations is None:
        return {}
    columns = {}
    for t, task in enumerate(tasks):
        columns[task + LOWER_SUFFIX], columns[task + UPPER_SUFFIX] = intervals(calibrations[task], mean[:, t],
                                                                               std[:, t], level)
    return columns


def _requested_columns(job: PredictJob) -> tuple[str, ...]:
    """The per-molecule extras ``job`` asked for (computed per block, attached only to the jobs that asked)."""
    return (DISTANCE_COLUMN, IN_DOMAIN_COLUMN) * job.domain + (EMBEDDING_COLUMN,) * job.embed


def _block_extras(block: Sequence[PredictJob], molecules, batch_size: int, domain: DomainColumns | None,
                  embedding: MemberEmbedding | None) -> dict[str, list]:
    """Per-row extras of a block's molecules, computed only when one of its jobs asked for them."""
    extras: dict[str, list] = {}
    if domain is not None and any(job.domain for job in block):
        extras.update({name: column.to_pylist() for name, column in domain(molecules, batch_size).items()})
    if embedding is not None and any(job.embed for job in block):
        extras.update(embedding(molecules, batch_size))
    return extras


def _entries(ensemble: Ensemble, job: PredictJob, reasons: Sequence[str | None], mean: np.ndarray,
             std: np.ndarray, calibrations: dict[str, Calibration] | None = None,
             extras: dict[str, list] | None = None) -> list[dict]:
    """One JSON-ready dict per molecule of ``job``: smiles, valid, error, then the tasks (their std, interval)."""
    tasks = ensemble.task_names
    bounds = _interval_columns(tasks, calibrations, job.interval, mean, std)
    out = []
    for i, smiles in enumerate(job.smiles):
        entry = {"smiles": smiles, "valid": reasons[i] is None, "error": reasons[i]}
        entry.update({task: _value(mean[i, t]) for t, task in enumerate(tasks)})
        if job.uncertainty:
            entry.update({task + STD_SUFFIX: _value(std[i, t]) for t, task in enumerate(tasks)})
        entry.update({column: _value(values[i]) for column, values in bounds.items()})
        entry.update({column: (extras or {})[column][i] for column in _requested_columns(job)})
        out.append(entry)
    return out


def predict_jobs(ensemble: Ensemble, features_generator: Sequence[str], jobs: Sequence[PredictJob],
                 batch_size: int, merge: bool,
                 calibrations: dict[str, Calibration] | None = None,
                 domain: DomainColumns | None = None,
                 embedding: MemberEmbedding | None = None) -> list[list[dict]]:
    """Every job's entries, in input order. ``merge``: one block for all jobs (batch-independent models only)."""
    blocks = [list(jobs)] if merge else [[job] for job in jobs]
    results: list[list[dict]] = []
    for block in blocks:
        smiles = [s for job in block for s in job.smiles]
        molecules = featurize_smiles(smiles, features_generator)
        prediction = ensemble.predict(molecules, batch_size)
        extras = _block_extras(block, molecules, batch_size, domain, embedding)
        start = 0
        for job in block:
            rows = slice(start, start + len(job.smiles))
            results.append(_entries(ensemble, job, molecules.reasons[rows], prediction.mean[rows],
                                    prediction.std[rows], calibrations,
                                    {name: values[rows] for name, values in extras.items()}))
            start = rows.stop
    return results


@serve.deployment
class ModelReplica:
    """One replica of one served model."""

    def __init__(self, model: ServedModel, batch_size: int, max_batch_size: int, batch_wait_timeout_s: float,
                 device: str = "cpu"):
        self.ensemble = Ensemble(model.members, device)
        self.features_generator, self.calibrations = model.features_generator, model.calibrations
        self.batch_size, self.merge = batch_size, model.batch_independent
        # the k-NN index is fitted here, once per replica (member 0's embedding, as kermt predict's actors)
        self.domain = (DomainColumns(model.domain, self.ensemble.models[0], self.ensemble.device)
                       if model.domain is not None else None)
        self.embedding = MemberEmbedding(model.members[0], device)  # its encoder loaded on the first "embed"
        self.predict.set_max_batch_size(max_batch_size)
        self.predict.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @serve.batch
    async def predict(self, jobs: list[PredictJob]) -> list[list[dict]]:
        # the forward runs in a thread, so the replica's event loop keeps queueing the next batch's requests
        return await asyncio.to_thread(predict_jobs, self.ensemble, self.features_generator, jobs,
                                       self.batch_size, self.merge, self.calibrations, self.domain,
                                       self.embedding)


__all__ = ["ModelReplica", "predict_jobs"]
