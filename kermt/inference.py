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
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from kermt.checkpoint import Checkpoint, load_finetune_model, load_into_model, load_pretrain_model, read_checkpoint
from kermt.checkpoint.keys import BOND_BRANCH_PREFIXES
from kermt.checkpoint.spec import CheckpointSpec
from kermt.chem.descriptors import GENERATOR_WIDTHS
from kermt.config import ReadoutConfig
from kermt.data.featurize import FeaturizedMolecules
from kermt.errors import UserError
from kermt.nn.encoder import KermtEmbedding
from kermt.nn.fingerprint import FingerprintSource, fingerprint_from_embeddings
from kermt.nn.readout import Readout

FAMILIES = ("atom_from_atom", "atom_from_bond", "bond_from_atom", "bond_from_bond")
SKIPPED_FILES = ("last_checkpoint.pt", "training_state.pt")  # resumable training state, not a best model


class FeatureMismatchError(UserError):
    """The molecule features offered for prediction are not the ones the checkpoint was trained with."""


# ---------------------------------------------------------------------------------------------- checkpoints


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_checkpoints(checkpoint_dir: str | Path) -> list[Path]:
    """Every member's best model under ``checkpoint_dir``, in natural order (fold_2 before fold_10).

    A native checkpoint directory is a member. A ``.pt`` file is a member unless it sits next to a native
    directory (``kermt finetune`` writes ``model_m/model/`` and its export ``model_m/model.pt``: one member, read
    natively) or is resumable training state. Hidden entries (atomic-write staging) are skipped.
    """
    from kermt.checkpoint import is_native_checkpoint

    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise UserError(f"--checkpoint_dir {root} is not a directory" + ("" if root.exists() else " (it does not "
                        "exist)") + "; pass the directory a finetune run saved to, or --checkpoint_path for one model")
    found: list[Path] = []
    for directory, subdirs, files in os.walk(root):
        here = Path(directory)
        subdirs[:] = _visible_after_recovery(here, subdirs)
        native = [here / d for d in subdirs if is_native_checkpoint(here / d)]
        found += native
        subdirs[:] = [d for d in subdirs if here / d not in native]
        if not native:
            found += [here / f for f in files if f.endswith(".pt") and f not in SKIPPED_FILES
                      and not f.startswith(".")]
    if not found:
        raise UserError(f"--checkpoint_dir {root}: no checkpoint under it (looked for native model directories and "
                        ".pt files); pass the --save_dir of a finished finetune run")
    return sorted(found, key=_natural_key)


def _visible_after_recovery(here: Path, subdirs: list[str]) -> list[str]:
    """The visible subdirectories, with a native checkpoint an interrupted replacement left aside (``.X.old``
    without ``X``) moved back into place first."""
    from kermt.checkpoint.native import recover_native

    parked = [d[1:-len(".old")] for d in subdirs if d.startswith(".") and d.endswith(".old")]
    recovered = [name for name in parked if recover_native(here / name)]
    return [d for d in subdirs if not d.startswith(".")] + recovered


def read_members(paths: Sequence[str | Path], trust_pickle: bool = False,
                 dataset_type: str | None = None) -> list[Checkpoint]:
    """Read every member; each must be a finetuned checkpoint. ``dataset_type``: the user's, for a file that stores
    neither its dataset type nor a ``data_scaler`` entry (see :func:`kermt.checkpoint.read_checkpoint`)."""
    members = [read_checkpoint(p, trust_pickle=trust_pickle, dataset_type=dataset_type) for p in paths]
    for member in members:
        if member.spec.kind != "finetuned":
            raise UserError(f"{member.path} is a {member.spec.kind} (pretraining) checkpoint: it has no prediction "
                             "head; use `kermt fingerprint` or `kermt embed` for its embeddings")
    return members


def task_names(spec: CheckpointSpec) -> tuple[str, ...]:
    return spec.task_names or tuple(f"task_{i}" for i in range(spec.head.num_tasks))


# ------------------------------------------------------------------------------------------------- features


@dataclass(frozen=True)
class FeaturePlan:
    """How molecule features are obtained for prediction.

    generator  names computed per molecule (empty when there are none or they come from a file)
    width      features per molecule (0: the model takes none)
    from_file  True when ``--features_path`` supplies them
    note       a line for the log when the choice was made automatically, else None
    """

    generator: tuple[str, ...]
    width: int
    from_file: bool = False
    note: str | None = None


def _expected(spec: CheckpointSpec) -> tuple[tuple[str, ...], int]:
    settings = spec.features
    if settings.use_cuikmolmaker_featurization or any("cuik" in g for g in settings.features_generator):
        raise FeatureMismatchError(
            "the checkpoint was trained with cuik-molmaker descriptors, which differ from descriptastorus by up to "
            "1.0 per value; this app computes descriptastorus features only, so it cannot reproduce them: predict "
            "with upstream KERMT and cuik-molmaker, or retrain with --features_generator rdkit_2d_normalized")
    return tuple(settings.features_generator), spec.head.features_size


def describe_expected(generator: tuple[str, ...], width: int) -> str:
    if width == 0:
        return "no molecule features"
    if generator:
        return f"--features_generator {' '.join(generator)} ({width} features)"
    return f"{width} precomputed features (--features_path)"


def plan_features(specs: Sequence[CheckpointSpec], features_generator: Sequence[str] | None = None,
                  features_path_width: int | None = None) -> FeaturePlan:
    """Check the user's feature flags against every member; raise :class:`FeatureMismatchError` naming what the
    checkpoint expects. ``None`` = flag not given (then the checkpoint's own generator is used)."""
    expected = {_expected(spec) for spec in specs}
    if len(expected) > 1:
        raise FeatureMismatchError("ensemble members were trained with different molecule features: "
                                   + "; ".join(describe_expected(*e) for e in sorted(expected))
                                   + "; predict with each group of members separately")
    generator, width = expected.pop()
    wanted = describe_expected(generator, width)
    if features_generator is not None and features_path_width is not None:
        raise FeatureMismatchError("give --features_generator or --features_path, not both")
    if features_path_width is not None:
        if features_path_width != width:
            raise FeatureMismatchError(f"--features_path has {features_path_width} features per molecule, but the "
                                       f"checkpoint expects {wanted}")
        return FeaturePlan((), width, from_file=True)
    if features_generator is not None:
        given = tuple(features_generator)
        if given != generator or (width and not generator):
            raise FeatureMismatchError(f"--features_generator {' '.join(given) or '(none)'} does not match the "
                                       f"checkpoint, which expects {wanted}")
        return FeaturePlan(generator, width)
    if width and not generator:
        raise FeatureMismatchError(f"the checkpoint expects {wanted}; pass them with --features_path")
    if generator and sum(GENERATOR_WIDTHS[g] for g in generator) != width:
        raise FeatureMismatchError(f"the checkpoint records generator {generator} but a features width of {width}; "
                                   "the file is inconsistent: pass the features it was trained with (--features_path)")
    note = f"molecule features: {' '.join(generator)} (from the checkpoint)" if generator else None
    return FeaturePlan(generator, width, note=note)


def scale_features(spec: CheckpointSpec, features: np.ndarray | None) -> torch.Tensor | None:
    """Raw features [M, F] -> the float32 tensor this member was trained on (its own features scaler)."""
    if features is None or features.shape[1] == 0:
        return None
    if spec.features_scaler is not None:
        features = np.nan_to_num(spec.features_scaler.transform(features), nan=0.0)
    return torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))


# ------------------------------------------------------------------------------------------------- ensemble


def batch_starts(n_rows: int, batch_size: int) -> range:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return range(0, n_rows, batch_size)


@dataclass
class EnsemblePrediction:
    """mean, std: float64 [N, T]; NaN rows for invalid molecules. ``std`` is the population std over members."""

    mean: np.ndarray
    std: np.ndarray


class Ensemble:
    """Finetuned members that predict together (mean over members, summed in member order as upstream)."""

    def __init__(self, members: Sequence[Checkpoint], device: torch.device | str = "cpu") -> None:
        if not members:
            raise ValueError("an ensemble needs at least one checkpoint")
        self.specs = [m.spec for m in members]
        names = {task_names(s) for s in self.specs}
        kinds = {s.head.dataset_type for s in self.specs}
        if len(names) > 1 or len(kinds) > 1:
            raise UserError(f"ensemble members disagree on tasks {sorted(names)} or dataset type {sorted(kinds)}: "
                            "their models were trained on different data; predict with each group separately")
        self.task_names = names.pop()
        self.dataset_type = kinds.pop()
        self.device = torch.device(device)
        self.models = [self._load(m) for m in members]

    def _load(self, checkpoint: Checkpoint) -> nn.Module:
        model, _ = load_finetune_model(checkpoint)
        return model.to(self.device).eval()

    @torch.no_grad()
    def member_predictions(self, molecules: FeaturizedMolecules) -> np.ndarray:
        """One batch: every row must be valid. Returns float64 [K members, M, T] in target units."""
        graph = molecules.batch_graph().to(self.device)
        raw = molecules.features if molecules.features.shape[1] else None
        out = []
        for spec, model in zip(self.specs, self.models):
            features = scale_features(spec, raw)
            prediction = model(graph, None if features is None else features.to(self.device)).prediction
            values = prediction.double().cpu().numpy()
            if spec.data_scaler is not None and self.dataset_type == "regression":
                values = spec.data_scaler.inverse_transform(values)
            out.append(values)
        return np.stack(out)

    def predict(self, molecules: FeaturizedMolecules, batch_size: int) -> EnsemblePrediction:
        """Predict a block whose first row starts a batch (see the module docstring for the batch rule)."""
        n, t = len(molecules), len(self.task_names)
        mean, std = np.full((n, t), np.nan), np.full((n, t), np.nan)
        for rows, members in map_valid_batches(molecules, batch_size, self.member_predictions):
            total = np.zeros_like(members[0])
            for values in members:  # upstream's order of summation
                total += values
            mean[rows] = total / len(members)
            std[rows] = members.std(axis=0)
        return EnsemblePrediction(mean, std)


# ----------------------------------------------------------------------------------------------- embeddings


class _EncoderOnly(nn.Module):
    """Holds an encoder under ``kermt`` so the strict loader sees the checkpoint's own key names."""

    def __init__(self, encoder: KermtEmbedding) -> None:
        super().__init__()
        self.kermt = encoder


class Embedder:
    """Encoder (+ cMIM latent head) of any checkpoint; mean readouts of each family, as upstream's fingerprints.

    A finetuned model is trained with the atom-output branches only; its bond families exist only when the file
    still carries the pretrained bond-output branches (upstream files do; ours keep them as passthrough).
    """

    def __init__(self, checkpoint: Checkpoint, device: torch.device | str = "cpu") -> None:
        self.path = checkpoint.path
        self.device = torch.device(device)
        self.latent = None
        if checkpoint.spec.kind in ("cmim", "hybrid"):
            model, _ = load_pretrain_model(checkpoint)
            self.encoder, self.latent = model.encoder, model.latent_dist
        else:
            self.encoder = self._encoder_only(checkpoint)
        self.encoder.to(self.device).eval()
        if self.latent is not None:
            self.latent.to(self.device).eval()
        hidden = self.encoder.config.hidden_size
        self.readout = Readout(hidden, ReadoutConfig(self_attention=False)).to(self.device)
        self.families = tuple(f for f in FAMILIES if f in self.encoder.encoders.branches)
        self.hidden_size = hidden

    @staticmethod
    def _encoder_only(checkpoint: Checkpoint) -> KermtEmbedding:
        source = {k: v for k, v in {**checkpoint.state_dict, **checkpoint.passthrough}.items()
                  if k.startswith("kermt.")}
        has_bond = any(k.startswith(BOND_BRANCH_PREFIXES) for k in source)
        config = dataclasses.replace(checkpoint.spec.encoder, embedding_output_type="both" if has_bond else "atom")
        holder = _EncoderOnly(KermtEmbedding(config))
        load_into_model(holder, source)
        return holder.kermt

    @property
    def has_latent(self) -> bool:
        return self.latent is not None

    def check_source(self, source: FingerprintSource) -> None:
        needed = {"atom": FAMILIES[:2], "bond": FAMILIES[2:], "both": FAMILIES}[source]
        missing = [f for f in needed if f not in self.families]
        if missing:
            raise UserError(
                f"--fingerprint_source {source} needs the encoder's {', '.join(missing)} output, but {self.path} has "
                "no bond-output branches (a finetuned model built without them); use --fingerprint_source atom")

    @torch.no_grad()
    def fingerprints(self, molecules: FeaturizedMolecules, source: FingerprintSource) -> np.ndarray:
        """One batch of valid rows -> float32 [M, k·hidden (+ features)], upstream's ``fps`` rows."""
        graph = molecules.batch_graph().to(self.device)
        features = None
        if molecules.features.shape[1]:
            features = torch.from_numpy(molecules.features.astype(np.float32)).to(self.device)
        fps = fingerprint_from_embeddings(self.encoder(graph), graph, self.readout, source, features)
        return fps.float().cpu().numpy()

    @torch.no_grad()
    def embeddings(self, molecules: FeaturizedMolecules) -> dict[str, np.ndarray]:
        """One batch of valid rows -> {family: float32 [M, hidden]} (+ ``projected`` [M, latent] for cMIM/hybrid)."""
        graph = molecules.batch_graph().to(self.device)
        encoded = self.encoder(graph)
        out = {}
        for name in self.families:
            scope = graph.a_scope if name.startswith("atom") else graph.b_scope
            out[name] = self.readout(getattr(encoded, name), scope)
        if self.latent is not None:
            out["projected"] = self.latent(graph, encoded).mean
        return {name: value.float().cpu().numpy() for name, value in out.items()}

    def output_widths(self) -> dict[str, int]:
        widths = {name: self.hidden_size for name in self.families}
        if self.latent is not None:
            widths["projected"] = self.latent.fc_mean_logscale.out_features // 2
        return widths


def map_valid_batches(molecules: FeaturizedMolecules, batch_size: int, fn) -> list[tuple[np.ndarray, object]]:
    """``fn(valid rows of one batch)`` for every batch of consecutive rows -> [(row indices, result)]."""
    results = []
    valid = molecules.valid
    for start in batch_starts(len(molecules), batch_size):
        rows = start + np.flatnonzero(valid[start : start + batch_size])
        if len(rows):
            results.append((rows, fn(molecules.select(rows))))
    return results


__all__ = [
    "FAMILIES", "Embedder", "Ensemble", "EnsemblePrediction", "FeatureMismatchError", "FeaturePlan",
    "describe_expected", "find_checkpoints", "map_valid_batches", "plan_features", "read_members",
    "scale_features", "task_names",
]
