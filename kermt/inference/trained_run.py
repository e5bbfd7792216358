"""``kermt.load_run(path)``: a trained run's models in this process, predicting what `kermt predict` writes for the
same run and SMILES (the same members, features, batches, calibration and domain; the columns of
:mod:`kermt.inference.columns`), as a pandas DataFrame. No Ray: for a notebook, a script, or a few thousand molecules
where a cluster's start-up would cost more than the prediction.

    run = kermt.load_run("runs/demo")
    frame = run.predict(["CCO", "c1ccccc1O"], interval=0.9, domain=True)

``path`` is what ``kermt predict --checkpoint_dir`` takes (a finetune run's ``--save_dir``: every member of every
fold, with its calibration and applicability domain) or one checkpoint (a native model directory or a ``.pt`` file;
no calibration, no domain). Checkpoints are read as data (no pickle) unless ``trust_checkpoint``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kermt.checkpoint import Checkpoint, is_native_checkpoint
from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from kermt.errors import UserError, user_input
from kermt.inference.attributions import Attributions, Attributor, unavailable_reason
from kermt.inference.columns import (ERROR_COLUMN, IN_DOMAIN_COLUMN, MODEL_SMILES_COLUMN, SMILES_COLUMN,
                                     VALID_COLUMN, OutputPlan, prediction_columns)
from kermt.inference.ensemble import Ensemble
from kermt.inference.features import FeatureMismatchError, FeaturePlan, plan_features
from kermt.inference.members import find_checkpoints, read_members, task_names
from kermt.names import level_not_percentage
from kermt.presets import PREDICT_BATCH_SIZE
from kermt.registry import DEFAULT_MAX_HEAVY_ATOMS
from kermt.uncertainty.domain import DomainScorer, run_domain
from kermt.uncertainty.run_calibration import HOW_TO_CALIBRATE, run_calibration, run_class_calibration

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class TrainedRun:
    """A run's ensemble, loaded once; :meth:`predict` as often as you like (see the module docstring)."""

    path: Path
    members: list[Checkpoint]
    ensemble: Ensemble
    features: FeaturePlan
    calibrations: dict | None  # a regression run's conformal calibrations, a classifier's recalibrations, or None
    batch_size: int = PREDICT_BATCH_SIZE
    max_heavy_atoms: int = DEFAULT_MAX_HEAVY_ATOMS  # larger molecules are invalid rows, decided from the parse
    _domain: DomainScorer | None = field(default=None, repr=False)

    @property
    def tasks(self) -> tuple[str, ...]:
        return self.ensemble.task_names

    @property
    def regression(self) -> bool:
        return self.ensemble.dataset_type == "regression"

    def predict(self, smiles: Sequence[str] | str, interval: float | None = None, domain: bool = False,
                uncertainty: bool = False, attributions: bool = False) -> "pd.DataFrame":
        """One row per SMILES, in order: ``smiles``, each task, then as asked ``<task>_std`` (``uncertainty``),
        the calibrated columns at level ``interval`` (a regression's bounds; a classifier's calibrated probability
        is there whenever the run is calibrated, its sets with ``interval``), ``<task>_atoms``/``<task>_baseline``
        (and ``<task>_descriptors`` for a model with descriptors; ``attributions``, as `kermt predict
        --attributions`: :mod:`kermt.inference.attributions`), ``domain_distance``/``in_domain`` (``domain``), then
        ``valid``, ``error`` (RDKit's reason) and, for a model that standardises its molecules, ``model_smiles``
        (the SMILES it saw, "" where that is the input). Invalid rows hold nulls; so do the attribution columns of
        a molecule over the attributions' budget, and of every molecule where the model's mode cannot give them
        (a warning says why)."""
        import pandas as pd

        smiles = [smiles] if isinstance(smiles, str) else list(smiles)
        outputs = self._outputs(uncertainty, interval, domain, attributions)
        prep = self.features.prep(self.max_heavy_atoms)
        molecules = featurize_smiles(smiles, self.features.generator, prep=prep)
        prediction = self.ensemble.predict(molecules, self.batch_size)
        # the distance is also read by a mondrian_domain calibration's intervals (its columns only with domain)
        scored = self._domain_scorer()(molecules, self.batch_size) if domain or outputs.needs_distance else None
        valid = np.asarray(molecules.valid, dtype=bool)
        explained = self._attributions(molecules) if attributions else None
        columns = prediction_columns(outputs, prediction.mean, prediction.std, valid, scored, explained)
        frame = pd.DataFrame({SMILES_COLUMN: smiles, **columns})
        if domain:  # null where invalid, as kermt predict writes it
            frame[IN_DOMAIN_COLUMN] = pd.array(np.where(valid, columns[IN_DOMAIN_COLUMN], None), dtype="boolean")
        frame[VALID_COLUMN] = valid
        frame[ERROR_COLUMN] = [reason or "" for reason in molecules.reasons]
        if prep.standardizes:
            frame[MODEL_SMILES_COLUMN] = list(molecules.model_smiles)
        return frame

    def _attributions(self, molecules: FeaturizedMolecules) -> Attributions | None:
        why_not = unavailable_reason(self.ensemble.specs, self.ensemble.rule.upstream_batching)
        if why_not:
            warnings.warn(f"the attribution columns stay empty: {why_not}", stacklevel=3)
            return None
        return Attributor(self.ensemble).attribute(molecules)

    def _outputs(self, uncertainty: bool, interval: float | None, domain: bool, attributions: bool) -> OutputPlan:
        """The columns asked for, checked against what the run has (a one-line UserError, as kermt predict's)."""
        if interval is not None and not 0 < level_not_percentage(interval, "interval=") < 1:
            raise UserError(f"interval={interval:g}: a level is a fraction in (0, 1), e.g. 0.9")
        if interval is not None and self.calibrations is None:
            raise UserError(f"interval={interval}: {self.path} has no calibration (a single checkpoint, or a run "
                            f"trained before calibration existed); {HOW_TO_CALIBRATE}")
        if interval is not None:
            for calibration in self.calibrations.values():
                calibration.quantile(interval)  # a level the calibration set is too small for names the task
        if domain:
            self._domain_scorer()  # no domain: the error names the run, before any molecule is featurised
        return OutputPlan(self.tasks, self.regression, uncertainty=uncertainty, interval=interval,
                          calibrations=self.calibrations if self.regression else None,
                          class_calibrations=None if self.regression else self.calibrations, domain=domain,
                          attributions=attributions, descriptors=self.features.width > 0)

    def _domain_scorer(self) -> DomainScorer:
        """The applicability domain of the run's first fold, loaded and checked on first use."""
        if self._domain is None:
            if not self.path.is_dir() or is_native_checkpoint(self.path):
                raise UserError(f"domain=True needs a finetune run's directory; {self.path} is one checkpoint")
            found = run_domain(self.path, self.members[0])
            if found.index is None:
                raise UserError(f"domain=True: {self.path} has no applicability domain ({found.why_not})")
            self._domain = DomainScorer(found.index, self.ensemble.models[0], self.ensemble.device,
                                        self.ensemble.rule)
        return self._domain


def load_run(path: str | Path, *, trust_checkpoint: bool = False, device: str = "cpu",
             batch_size: int = PREDICT_BATCH_SIZE, upstream_batching: bool = False,
             reference_width: int | None = None, max_heavy_atoms: int = DEFAULT_MAX_HEAVY_ATOMS) -> TrainedRun:
    """The models of ``path`` (a run's directory or one checkpoint), ready to predict (module docstring).
    ``upstream_batching``, ``reference_width``: as kermt predict's flags (:mod:`kermt.inference.widths`): by
    default a molecule's numbers depend on it and the model only. ``max_heavy_atoms``: as ``--max_heavy_atoms``."""
    path = Path(path)
    with user_input():
        if not path.exists():
            raise UserError(f"{path} does not exist; pass a finetune run's --save_dir or a checkpoint")
        single = not path.is_dir() or is_native_checkpoint(path)
        members = read_members(find_checkpoints(path) if not single else [path], trust_pickle=trust_checkpoint)
        try:
            features = plan_features([m.spec for m in members])
        except FeatureMismatchError as error:
            raise UserError(f"{path}: {error}; kermt.load_run computes features from SMILES only: use `kermt "
                            "predict --features_path` for this model") from error
        spec = members[0].spec
        tasks, regression = task_names(spec), spec.head.dataset_type == "regression"
        calibrations = None if single else (run_calibration if regression else run_class_calibration)(path, tasks)
        ensemble = Ensemble(members, device, upstream_batching=upstream_batching, reference_width=reference_width)
        return TrainedRun(path, members, ensemble, features, calibrations, batch_size, max_heavy_atoms)


__all__ = ["TrainedRun", "load_run"]
