"""Model replicas: the ensemble loaded once per replica; each call carries a group of requests of different
clients (the ingress gathers the requests that arrive while the model's calls are busy, :mod:`ray_app.serve.
coalesce`).

A call's requests are featurised (RDKit) as soon as it reaches the replica, in a worker thread, while the previous
call's forwards run (torch releases the GIL, RDKit holds it: the two overlap); calls that meet in the replica are
merged by ``@serve.batch`` (those that arrived within ``batch_wait_timeout_s``). The molecules of every request
of a batch share forwards of up to ``batch_size`` molecules and ``max_batch_atoms`` atoms (:func:`kermt.inference.
shared.predict_blocks`), and still each request gets `kermt predict`'s numbers: a molecule's number depends on the
molecule and the model only (each is computed at its reference width, :mod:`kermt.inference.widths`; serve has no
upstream batching), so a client's numbers never depend on what other clients sent, nor on how many SMILES it sent
at once. An invalid SMILES is its own entry with RDKit's reason, never an error; so is a molecule over
``--max_heavy_atoms``, refused from its SMILES in milliseconds (it would hold the replica for minutes). A model that
standardises its molecules applies its standardisation, and its entries say what it saw (``model_smiles``).

Each entry holds `kermt predict`'s columns for the molecule, computed by the same code
(:mod:`kermt.inference.columns`). ``"domain": true`` adds ``domain_distance``/``in_domain`` from the index fitted
once, in the replica's constructor (:class:`kermt.uncertainty.domain.DomainScorer`, as `kermt predict`'s actors);
``"embed": true`` adds ``embedding``, member 0's readout (:mod:`ray_app.serve.embedding`). Both are computed per
request that asks (their forwards are not shared). ``"attributions": true`` adds the per-atom attribution columns
and ``attributions_note`` (:mod:`ray_app.serve.attributions`); the molecules of every request that asks share the
attributor's forwards, each at its reference width, so they too depend on the molecule and the model only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from ray import serve

from kermt.chem.standardize import DEFAULT_MAX_HEAVY_ATOMS, MoleculePrep
from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from kermt.inference import Ensemble, EnsemblePrediction
from kermt.inference.attributions import Attributions
from kermt.inference.columns import MODEL_SMILES_COLUMN, OutputPlan, prediction_columns
from kermt.inference.shared import predict_blocks
from kermt.uncertainty.domain import DomainScorer
from ray_app.serve.attributions import ATTRIBUTIONS_NOTE, ServedAttributions, atom_lists
from ray_app.serve.embedding import EMBEDDING_COLUMN, MemberEmbedding
from ray_app.serve.models import ServedModel
from ray_app.serve.schemas import PredictJob


def _value(x):
    """A JSON-ready value: NaN and numpy scalars become null and Python values."""
    if isinstance(x, np.generic):
        x = x.item()
    return None if isinstance(x, float) and np.isnan(x) else x


def _requested_columns(job: PredictJob) -> tuple[str, ...]:
    """The per-molecule extras ``job`` asked for that are not prediction columns."""
    return (EMBEDDING_COLUMN,) * job.embed + (ATTRIBUTIONS_NOTE,) * job.attributions


def _job_outputs(base: OutputPlan, job: PredictJob, has_domain: bool) -> OutputPlan:
    """The prediction columns of one request: the model's calibration at the level it asked, its std and domain
    when it asked for them (:mod:`kermt.inference.columns`, as `kermt predict` writes them; the ingress refuses a
    level or a domain the model has not), its attributions when it asked."""
    return replace(base, uncertainty=job.uncertainty, interval=job.interval, domain=job.domain and has_domain,
                   attributions=job.attributions)


def _entries(outputs: OutputPlan, job: PredictJob, molecules: FeaturizedMolecules, prediction: EnsemblePrediction,
             domain: tuple[np.ndarray, np.ndarray] | None, extras: dict[str, list], standardizes: bool,
             attributions: Attributions | None = None) -> list[dict]:
    """One JSON-ready dict per molecule of ``job``: smiles, valid, error, then `kermt predict`'s columns (the tasks,
    their std, interval or calibrated probability and set, attributions, the domain), then the extras (its
    embedding, its attributions' note); for a model that standardises, model_smiles after error."""
    valid = np.asarray(molecules.valid, dtype=bool)
    columns = prediction_columns(outputs, prediction.mean, prediction.std, valid, domain, attributions)
    out = []
    for i, smiles in enumerate(job.smiles):
        entry = {"smiles": smiles, "valid": bool(valid[i]), "error": molecules.reasons[i]}
        if standardizes:
            entry[MODEL_SMILES_COLUMN] = molecules.model_smiles[i]
        entry.update({name: _value(values[i]) if valid[i] else None for name, values in columns.items()})
        entry.update({name: extras[name][i] for name in _requested_columns(job)})
        atom_lists(outputs.tasks, entry)
        out.append(entry)
    return out


class Predictor:
    """What a replica computes, without Serve (tests call it directly): a served model's ensemble and extras."""

    def __init__(self, model: ServedModel, batch_size: int, max_batch_atoms: int | None = None,
                 device: str = "cpu", max_heavy_atoms: int = DEFAULT_MAX_HEAVY_ATOMS):
        self.ensemble = Ensemble(model.members, device)
        self.features_generator = model.features_generator
        self.prep = MoleculePrep(model.info.standardize, max_heavy_atoms)
        regression = self.ensemble.dataset_type == "regression"
        self.outputs = OutputPlan(self.ensemble.task_names, regression,
                                  calibrations=model.calibrations if regression else None,
                                  class_calibrations=None if regression else model.calibrations,
                                  descriptors=self.ensemble.specs[0].head.features_size > 0)
        self.batch_size, self.max_batch_atoms = batch_size, max_batch_atoms
        # the k-NN index is fitted here, once per replica (member 0's embedding, as kermt predict's actors)
        self.domain = (DomainScorer(model.domain, self.ensemble.models[0], self.ensemble.device, self.ensemble.rule)
                       if model.domain is not None else None)
        # its encoder loaded on the first "embed"
        self.embedding = MemberEmbedding(model.members[0], device, self.ensemble.rule.reference_width)
        self.attributions = ServedAttributions(self.ensemble)

    def featurize(self, jobs: Sequence[PredictJob]) -> list[FeaturizedMolecules]:
        """Each job's molecules featurised."""
        return [featurize_smiles(job.smiles, self.features_generator, prep=self.prep) for job in jobs]

    def predict(self, jobs: Sequence[PredictJob], blocks: Sequence[FeaturizedMolecules]) -> list[list[dict]]:
        """Every job's entries, in input order; ``blocks``: each job's featurised molecules."""
        predictions = predict_blocks(self.ensemble, blocks, self.batch_size, self.max_batch_atoms)
        explained = self.attributions(jobs, blocks)
        out = []
        for job, molecules, prediction, attributions in zip(jobs, blocks, predictions, explained):
            # the domain and the embedding are computed per request that asks (their forwards are not shared), the
            # domain also for intervals that read its distance (a mondrian_domain calibration)
            outputs = _job_outputs(self.outputs, job, self.domain is not None)
            wanted = job.domain or outputs.needs_distance
            domain = self.domain(molecules, self.batch_size) if self.domain is not None and wanted else None
            extras = self.embedding(molecules, self.batch_size) if job.embed else {}
            if job.attributions:
                extras[ATTRIBUTIONS_NOTE] = self.attributions.notes(molecules.valid, attributions)
            out.append(_entries(outputs, job, molecules, prediction, domain, extras, self.prep.standardizes,
                                attributions))
        return out

    def predict_smiles(self, jobs: Sequence[PredictJob]) -> list[list[dict]]:
        return self.predict(jobs, self.featurize(jobs))


@serve.deployment
class ModelReplica:
    """One replica of one served model. A call carries a group of requests (the ingress coalesces the requests
    that arrive while the model's calls are busy, :mod:`ray_app.serve.coalesce`)."""

    def __init__(self, model: ServedModel, batch_size: int, max_batch_size: int, batch_wait_timeout_s: float,
                 max_batch_atoms: int | None = None, device: str = "cpu",
                 max_heavy_atoms: int = DEFAULT_MAX_HEAVY_ATOMS):
        self.predictor = Predictor(model, batch_size, max_batch_atoms, device, max_heavy_atoms)
        self._predict_batch.set_max_batch_size(max_batch_size)
        self._predict_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self._in_flight = 0  # calls in this replica now (the event loop's thread alone changes it)

    async def predict(self, jobs: Sequence[PredictJob],
                      molecules: Sequence[FeaturizedMolecules] | None = None) -> list[list[dict]]:
        """Each job's entries; ``molecules``: the jobs' SMILES featurised by the Featurizer deployment, None:
        featurise them here."""
        self._in_flight += 1
        try:
            if molecules is None:  # featurised on arrival, in a thread: it overlaps the call whose forwards run now
                molecules = await asyncio.to_thread(self.predictor.featurize, jobs)
            if self._in_flight == 1:
                # alone in the replica: waiting batch_wait_timeout_s for company would only add latency (a
                # client sending one molecule at a time: 13 instead of 25 ms, bench/serve.py)
                return await asyncio.to_thread(self.predictor.predict, jobs, molecules)
            return await self._predict_batch((jobs, molecules))
        finally:
            self._in_flight -= 1

    @serve.batch
    async def _predict_batch(self, calls: list[tuple[Sequence[PredictJob], Sequence[FeaturizedMolecules]]]
                             ) -> list[list[list[dict]]]:
        # calls that met in this replica share forwards too; the forwards run in a thread, so the replica's event
        # loop keeps featurising and queueing calls
        jobs = [job for call_jobs, _ in calls for job in call_jobs]
        blocks = [block for _, call_blocks in calls for block in call_blocks]
        entries = await asyncio.to_thread(self.predictor.predict, jobs, blocks)
        out, start = [], 0
        for call_jobs, _ in calls:
            out.append(entries[start : start + len(call_jobs)])
            start += len(call_jobs)
        return out


__all__ = ["ModelReplica", "Predictor"]
