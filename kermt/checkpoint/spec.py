"""What a checkpoint holds, independent of its file format: kind, architecture, tasks, scalers, feature settings.

Upstream ``.pt`` files and our native directories both describe themselves with a :class:`CheckpointSpec`, so
inspection, loading and export do not care where a model came from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kermt.chem.standardize import UNRECORDED_STANDARDIZATION, check_standardization
from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig, from_dict, to_dict
from kermt.data.scalers import StandardScaler
from kermt.registry import CHECKPOINT_KINDS, PRETRAIN_KINDS, CheckpointKind, Standardization


@dataclass(frozen=True)
class FeatureSettings:
    """Molecule-level features a finetuned model was trained with (prediction must use the same). ``standardize``:
    how its molecules were standardised (kermt.chem.standardize); "none" for a file that records none (upstream's)."""

    features_generator: tuple[str, ...] = ()
    features_scaling: bool = True
    rdkit2D_normalization_type: str | None = None
    use_cuikmolmaker_featurization: bool = False
    standardize: Standardization = UNRECORDED_STANDARDIZATION

    def __post_init__(self) -> None:
        check_standardization(self.standardize, "the checkpoint's features.standardize")


@dataclass(frozen=True, eq=False)
class CheckpointSpec:
    """Everything needed to rebuild and use the model in a checkpoint.

    ``readout``/``head`` are set for finetuned checkpoints only: a pretrain checkpoint has no finetune head, so the
    user's settings decide it. ``pretrain`` keeps the pretraining-only settings (latent_dim, decoder_*, vocab
    sizes) as plain JSON values. ``notes`` say which values were inferred from tensor shapes or defaulted.

    ``reference_width``: the neighbour width ``W`` an upstream-padded model computes each molecule at (at least; its
    own largest degree when larger, kermt.inference.widths); None when the model records none (upstream's files).
    ``training_widths``: {neighbour width: training batches} of a model finetuned here, which ``W`` is the mode of.
    """

    kind: CheckpointKind
    encoder: EncoderConfig
    readout: ReadoutConfig | None = None
    head: HeadConfig | None = None
    use_mtl_loss: bool = False
    task_names: tuple[str, ...] | None = None
    features: FeatureSettings = field(default_factory=FeatureSettings)
    data_scaler: StandardScaler | None = None
    features_scaler: StandardScaler | None = None
    pretrain: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    reference_width: int | None = None
    training_widths: dict[int, int] | None = None

    def __eq__(self, other: object) -> bool:
        # by value: the dataclass default would compare the scalers' numpy arrays element-wise and fail
        return isinstance(other, CheckpointSpec) and self.to_dict() == other.to_dict()

    __hash__ = None  # equal by value (to_dict), and the scalers' numpy arrays cannot be hashed

    def __post_init__(self) -> None:
        if self.kind not in CHECKPOINT_KINDS:
            raise ValueError(f"checkpoint kind {self.kind!r} is not one of {CHECKPOINT_KINDS}")
        if self.kind == "finetuned" and (self.readout is None or self.head is None):
            raise ValueError("a finetuned checkpoint spec needs readout and head")

    @classmethod
    def for_finetune_model(cls, config: FinetuneModelConfig, *, task_names: tuple[str, ...] | None = None,
                           features: FeatureSettings | None = None, data_scaler: StandardScaler | None = None,
                           features_scaler: StandardScaler | None = None, reference_width: int | None = None,
                           training_widths: dict[int, int] | None = None) -> "CheckpointSpec":
        """The spec of a finetune model trained here (what :func:`save_native` stores next to its weights)."""
        return cls(kind="finetuned", encoder=config.encoder, readout=config.readout, head=config.head,
                   use_mtl_loss=config.use_mtl_loss, task_names=task_names, features=features or FeatureSettings(),
                   data_scaler=data_scaler, features_scaler=features_scaler, reference_width=reference_width,
                   training_widths=training_widths)

    def finetune_model_config(self) -> FinetuneModelConfig:
        """The config that rebuilds this finetuned model (atom-output branches only, as the finetune model builds)."""
        if self.kind != "finetuned":
            raise ValueError(f"a {self.kind} checkpoint has no finetune head; merge it with user settings instead")
        encoder = dataclasses.replace(self.encoder, embedding_output_type="atom")
        return FinetuneModelConfig(encoder, self.readout, self.head, self.use_mtl_loss)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (scalers as lists, tuples as lists)."""
        return _lists_for_tuples({
            "kind": self.kind,
            "encoder": to_dict(self.encoder),
            "readout": to_dict(self.readout) if self.readout else None,
            "head": to_dict(self.head) if self.head else None,
            "use_mtl_loss": self.use_mtl_loss,
            "task_names": list(self.task_names) if self.task_names is not None else None,
            "features": to_dict(self.features),
            "data_scaler": self.data_scaler.to_dict() if self.data_scaler else None,
            "features_scaler": self.features_scaler.to_dict() if self.features_scaler else None,
            "pretrain": dict(self.pretrain),
            "notes": list(self.notes),
            "reference_width": self.reference_width,
            "training_widths": ({str(width): count for width, count in self.training_widths.items()}
                                if self.training_widths is not None else None),
        })

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CheckpointSpec":
        return cls(
            kind=data["kind"],
            encoder=from_dict(EncoderConfig, data["encoder"]),
            readout=from_dict(ReadoutConfig, data["readout"]) if data.get("readout") else None,
            head=from_dict(HeadConfig, data["head"]) if data.get("head") else None,
            use_mtl_loss=bool(data.get("use_mtl_loss", False)),
            task_names=tuple(data["task_names"]) if data.get("task_names") is not None else None,
            features=from_dict(FeatureSettings, data.get("features") or {}),
            data_scaler=StandardScaler.from_dict(data.get("data_scaler")),
            features_scaler=StandardScaler.from_dict(data.get("features_scaler")),
            pretrain=dict(data.get("pretrain") or {}),
            notes=tuple(data.get("notes") or ()),
            reference_width=data.get("reference_width"),
            training_widths=({int(width): int(count) for width, count in data["training_widths"].items()}
                             if data.get("training_widths") is not None else None),
        )


def _lists_for_tuples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists_for_tuples(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists_for_tuples(v) for v in value]
    return value


__all__ = ["CHECKPOINT_KINDS", "CheckpointKind", "CheckpointSpec", "FeatureSettings", "PRETRAIN_KINDS"]
