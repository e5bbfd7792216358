"""Molecule features for prediction: check that the features offered are the ones every member was trained with
(generator, width), pick the checkpoint's own generator when none is named, and scale them per member; and the
standardisation every member's molecules went through (prediction applies the same)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kermt.checkpoint.spec import CheckpointSpec
from kermt.registry import GENERATOR_WIDTHS
from kermt.chem.standardize import DEFAULT_MAX_HEAVY_ATOMS, UNRECORDED_STANDARDIZATION, MoleculePrep
from kermt.errors import UserError

class FeatureMismatchError(UserError):
    """The molecule features offered for prediction are not the ones the checkpoint was trained with."""


@dataclass(frozen=True)
class FeaturePlan:
    """How molecule features are obtained for prediction.

    generator  names computed per molecule (empty when there are none or they come from a file)
    width      features per molecule (0: the model takes none)
    from_file  True when ``--features_path`` supplies them
    note       a line for the log when the choice was made automatically, else None
    standardize  how the members' molecules were standardised (prediction does the same)
    """

    generator: tuple[str, ...]
    width: int
    from_file: bool = False
    note: str | None = None
    standardize: str = UNRECORDED_STANDARDIZATION

    def prep(self, max_heavy_atoms: int = DEFAULT_MAX_HEAVY_ATOMS) -> MoleculePrep:
        """How each molecule is prepared for these members: their standardisation, under ``max_heavy_atoms``."""
        return MoleculePrep(self.standardize, max_heavy_atoms)


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
    checkpoint expects. ``None`` = flag not given (then the checkpoint's own generator is used). The plan carries
    the members' standardisation (they must agree)."""
    standardizations = sorted({spec.features.standardize for spec in specs})
    if len(standardizations) > 1:
        raise FeatureMismatchError("ensemble members standardised their molecules differently "
                                   f"({', '.join(standardizations)}); predict with each group of members separately")
    plan = _plan_generator(specs, features_generator, features_path_width)
    return dataclasses.replace(plan, standardize=standardizations[0]) if standardizations else plan


def _plan_generator(specs: Sequence[CheckpointSpec], features_generator: Sequence[str] | None,
                    features_path_width: int | None) -> FeaturePlan:
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
