"""Typed configuration of the kermt library.

Frozen dataclasses, JSON-serialisable through :func:`to_dict` / :func:`from_dict`. Names reuse upstream's
snake_case flag names where the concept is the same, so upstream users recognise them.

Architecture (``EncoderConfig``, the shape-defining parts of ``ReadoutConfig`` and ``HeadConfig``) comes from a
checkpoint when one is loaded; training settings (dropout, dist_coff, bond_drop_rate, ...) stay the user's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from kermt.names import did_you_mean

# The names each setting takes: kermt.registry. Literal types are not checked at run time, so __post_init__ checks
# them: a typo would otherwise build a model in no mode at all.
from kermt.registry import (
    ACTIVATIONS,
    DATASET_TYPES,
    EMBEDDING_OUTPUT_TYPES,
    FEATURE_GENERATORS,
    PADDING_MODES,
    Activation,
    DatasetType,
    EmbeddingOutputType,
    PaddingMode,
)

ATOM_FDIM = 151
BOND_FDIM = 165  # source atom features (151) + bond features (14)


# The encoder settings a user may give (flags of finetune from scratch and of pretrain); the rest follow from them or
# from the checkpoint.
ENCODER_ARCHITECTURE_KEYS = ("hidden_size", "depth", "num_attn_head", "num_mt_block", "activation", "bias")


@dataclass(frozen=True)
class EncoderConfig:
    """GTransEncoder architecture (docs/upstream-compatibility.md#encoder).

    ``embedding_output_type`` selects which output branches are *built*: a finetune model builds only the two
    atom-level branches ("atom"), so DDP never sees parameters without gradients. Pretraining uses "both".

    ``padding``: "upstream" reproduces upstream exactly: the padding row 0 takes part in every neighbour sum, so
    embeddings depend on the batch's maximum atom degree (docs/numerics.md#padding-modes). "zero" keeps row 0 at zero
    after every transform, which makes each molecule's output independent of the rest of its batch.

    ``undirected=True`` is refused: upstream's node blocks average ATOM messages with the reverse-BOND index
    (``message[b2revb]``, docs/upstream-compatibility.md#message-passing), so upstream crashes at its first forward with
    it; no upstream model can have been trained with it, and there are no upstream semantics to reproduce.
    """

    hidden_size: int = 800
    depth: int = 6
    num_attn_head: int = 4
    num_mt_block: int = 1
    activation: Activation = "PReLU"
    bias: bool = False
    undirected: bool = False
    dropout: float = 0.0
    embedding_output_type: EmbeddingOutputType = "both"
    padding: PaddingMode = "upstream"
    atom_fdim: int = ATOM_FDIM
    bond_fdim: int = BOND_FDIM

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {ACTIVATIONS}")
        _check_choice("padding", self.padding, PADDING_MODES)
        _check_choice("embedding_output_type", self.embedding_output_type, EMBEDDING_OUTPUT_TYPES)
        if self.undirected:
            raise ValueError(
                "undirected=True is not supported: upstream KERMT's node blocks index atom messages with reverse-bond "
                "indices, so upstream itself fails at the first forward with it and no upstream model uses it; "
                "leave undirected unset (False)"
            )
        check_attention_heads(self.hidden_size, self.num_attn_head)


def check_attention_heads(hidden_size: int, num_attn_head: int) -> None:
    """The encoder's attention splits hidden_size over its heads. Also `kermt pretrain`'s flag check, so a bad pair
    is refused before Ray starts, with the same words."""
    if hidden_size % num_attn_head:
        raise ValueError(f"hidden_size {hidden_size} must be divisible by num_attn_head {num_attn_head}")


@dataclass(frozen=True)
class ReadoutConfig:
    """Molecule readout: mean over atoms, or structured self-attention (docs/upstream-compatibility.md#readout)."""

    self_attention: bool = False
    attn_hidden: int = 4
    attn_out: int = 8

    def output_size(self, hidden_size: int) -> int:
        return hidden_size * self.attn_out if self.self_attention else hidden_size


@dataclass(frozen=True)
class HeadConfig:
    """Finetune FFN heads (docs/upstream-compatibility.md#finetune-heads).

    ``ffn_hidden_size`` None means "equal to the encoder's hidden size". ``variance``: the head also predicts a
    variance per task (mean-variance estimation, ``kermt finetune --loss mve``; regression only); a checkpoint
    without the key is a plain (mean-only) model. ``features_ffn``: the molecule features also pass through an FFN of
    their own whose output is added to each view's, so that descriptors can carry the model alone (no upstream
    counterpart; off for every upstream checkpoint, which has no such layers)."""

    num_tasks: int
    dataset_type: DatasetType
    features_size: int = 0
    ffn_hidden_size: int | None = None
    ffn_num_layers: int = 2
    ffn_num_task_specific_layers: int = 0
    ffn_task_specific_hidden_size: int | None = None
    dropout: float = 0.0
    activation: Activation = "PReLU"
    variance: bool = False
    features_ffn: bool = False

    def __post_init__(self) -> None:
        if self.features_ffn and self.features_size < 1:
            raise ValueError("features_ffn needs molecule features (features_size 0): add --features_generator")
        _check_choice("dataset_type", self.dataset_type, DATASET_TYPES)
        if self.variance and self.dataset_type != "regression":
            raise ValueError(f"a variance head (--loss mve) is for regression, not {self.dataset_type}")
        if self.num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {self.num_tasks}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {ACTIVATIONS}")


@dataclass(frozen=True)
class FinetuneModelConfig:
    """Everything needed to build a finetune model. ``use_mtl_loss`` adds learned per-task ``log_sigma``."""

    encoder: EncoderConfig
    readout: ReadoutConfig
    head: HeadConfig
    use_mtl_loss: bool = False


T = TypeVar("T")


def to_dict(config: Any) -> dict[str, Any]:
    """A plain JSON-ready dict (tuples become lists)."""
    return dataclasses.asdict(config)


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build ``cls`` from a dict, recursing into nested dataclasses. Unknown keys are an error naming the key."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        raise ValueError(f"unknown key {key!r} for {cls.__name__}{did_you_mean(key, fields)}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(fields[name], value)
    return cls(**kwargs)


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    nested = {"encoder": EncoderConfig, "readout": ReadoutConfig, "head": HeadConfig}
    if f.name in nested and isinstance(value, dict):
        return from_dict(nested[f.name], value)
    if isinstance(value, list):
        return tuple(value)
    return value


def _check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key} {value!r} is not one of {allowed}{did_you_mean(str(value), allowed)}")


__all__ = [
    "ENCODER_ARCHITECTURE_KEYS",
    "ACTIVATIONS",
    "ATOM_FDIM",
    "BOND_FDIM",
    "EMBEDDING_OUTPUT_TYPES",
    "EncoderConfig",
    "FEATURE_GENERATORS",
    "FinetuneModelConfig",
    "HeadConfig",
    "PADDING_MODES",
    "ReadoutConfig",
    "check_attention_heads",
    "from_dict",
    "to_dict",
]
