"""The models a `kermt serve` app holds, read once on the driver with the library code `kermt predict` uses.

A source is what ``kermt predict`` takes: a finetune run's directory (every member's best model: an ensemble), a
native checkpoint directory or one ``.pt`` file. Checkpoints are read safely (no pickle unless
``--trust_checkpoint``) and checked here, before Ray Serve starts, so a wrong path costs a second; the replicas get
the members through the object store and never read the driver's files.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kermt.checkpoint import Checkpoint, is_native_checkpoint
from kermt.checkpoint.upstream import file_sha256
from kermt.errors import UserError, user_input
from kermt.inference import find_checkpoints, plan_features, read_members, task_names
from kermt.inputs import check_checkpoint_file
from kermt.uncertainty import Calibration
from kermt.uncertainty.domain import DOMAIN_FILE, DomainIndex, run_domain
from kermt.uncertainty.classification import ClassCalibration
from kermt.uncertainty.run_calibration import run_calibration, run_class_calibration
from ray_app.serve.embedding import embedding_size
from ray_app.serve.run_metrics import training_metrics
from ray_app.serve.schemas import MemberInfo, ModelInfo


@dataclass(frozen=True)
class ServedModel:
    """One model of the app: its members and the molecule features they were trained with."""

    name: str
    members: list[Checkpoint]
    features_generator: tuple[str, ...]
    info: ModelInfo
    # per task, when the run was calibrated: a regression's intervals, a classifier's probabilities and sets
    calibrations: dict[str, Calibration] | dict[str, ClassCalibration] | None = None
    domain: DomainIndex | None = None  # fold 0's applicability domain, as `kermt predict --applicability_domain`


def member_paths(source: str | Path) -> list[Path]:
    """A run directory's members, or the one checkpoint (file or native directory) ``source`` is."""
    path = Path(source)
    if path.is_dir() and not is_native_checkpoint(path):
        return find_checkpoints(path)
    return [path]


def checkpoint_sha256(path: Path) -> str:
    """A file's sha256; for a native directory, the sha256 of its files' relative names and sha256s, in order."""
    if path.is_file():
        return file_sha256(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{file_sha256(file)}\n".encode())
    return digest.hexdigest()


def load_calibrations(source: str | Path, tasks: tuple[str, ...],
                      dataset_type: str) -> dict[str, Calibration] | dict[str, ClassCalibration] | None:
    """The run's calibration as `kermt predict --checkpoint_dir DIR` finds it (folds pooled): a regression's
    conformal scores, a classifier's recalibration and set scores; None for a single checkpoint or a run trained
    before calibration existed."""
    path = Path(source)
    if not path.is_dir() or is_native_checkpoint(path):
        return None
    return run_calibration(path, tasks) if dataset_type == "regression" else run_class_calibration(path, tasks)


def load_domain_index(source: str | Path, members: list[Checkpoint]) -> tuple[DomainIndex | None, str | None]:
    """(index, None) as `kermt predict --checkpoint_dir DIR --applicability_domain` finds and checks it (member 0's
    fold), or (None, why not): a single checkpoint, a run trained before the domain existed, a stale file."""
    path = Path(source)
    if not path.is_dir() or is_native_checkpoint(path):
        return None, f"it is one checkpoint, not a finetune run's directory (serve the run's --save_dir: each " \
                     f"fold_k/ holds {DOMAIN_FILE})"
    found = run_domain(path, members[0])
    return found.index, found.why_not


def load_served_model(name: str, source: str | Path, *, default: bool, trust_checkpoint: bool) -> ServedModel:
    """Read and check the members of model ``name`` (a UserError names the model and the file)."""
    with user_input():
        paths = member_paths(source)
        for path in paths:
            check_checkpoint_file(path, f"model {name!r}")
        members = read_members(paths, trust_pickle=trust_checkpoint)
        plan = plan_features([m.spec for m in members])
    specs = [m.spec for m in members]
    paddings = {s.encoder.padding for s in specs}
    if len(paddings) > 1:
        raise UserError(f"model {name!r}: members were trained with different padding modes {sorted(paddings)}")
    first = specs[0]
    with user_input():
        calibrations = load_calibrations(source, tuple(task_names(first)), first.head.dataset_type)
        domain, no_domain = load_domain_index(source, members)
        training = training_metrics(source)
    calibration = next(iter(calibrations.values())) if calibrations else None
    info = ModelInfo(name=name, default=default, tasks=list(task_names(first)), dataset_type=first.head.dataset_type,
                     features_generator=list(plan.generator), features_scaling=first.features_scaler is not None,
                     padding=paddings.pop(), standardize=plan.standardize,
                     members=[MemberInfo(path=str(m.path), sha256=checkpoint_sha256(Path(m.path))) for m in members],
                     calibrated=calibration is not None, calibration_method=calibration and calibration.method,
                     calibration_size=calibration and calibration.n, domain=domain is not None,
                     domain_missing=no_domain, embedding_size=embedding_size(members[0]),
                     training=training)
    return ServedModel(name, members, tuple(plan.generator), info, calibrations, domain)


__all__ = ["ServedModel", "checkpoint_sha256", "load_calibrations", "load_domain_index", "load_served_model",
           "member_paths"]
