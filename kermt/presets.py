"""Named defaults: the architecture and training settings each way of starting a model begins from.

The kermt dataclasses are the one source of every default. ``EncoderConfig()`` is the released NV-KERMT-70M-v2's
encoder (800 wide, depth 6, 4 heads, 1 block, PReLU, all four output branches), which is also what upstream's tools
fill in for a key a checkpoint lacks; ``PretrainHeadsConfig``'s field defaults are that release's latent head and
decoder. A preset spells only where its upstream parser differs from them, and says why. The command schemas
(``ray_app/finetune/config.py``, ``ray_app/pretrain/config.py``, ``ray_app/common/data_parallel.py``), a finetune from
scratch (``ray_app/finetune/run_setup.py``) and the upstream export (``kermt/checkpoint/export.py``) read these;
nothing else writes the numbers again. Upstream's parser defaults: docs/upstream-compatibility.md and the upstream
spec's CLI tables.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kermt.config import EncoderConfig, ReadoutConfig
from kermt.nn.pretrain.config import PretrainLossConfig


@dataclass(frozen=True)
class TrainingDefaults:
    """Upstream ``main.py finetune``'s training-argument defaults, the ones `kermt finetune` keeps and an exported
    ``model.pt`` carries in its ``args``. ``batch_size``, ``weight_decay`` and ``seed`` are also ``pretrain_ddp.py``'s,
    so every training command shares them (``ray_app/common/data_parallel.py``, `kermt pretrain`'s ``--seed``)."""

    batch_size: int = 32
    weight_decay: float = 0.0
    seed: int = 0
    ensemble_size: int = 1
    fine_tune_coff: float = 1.0
    dist_coff: float = 0.1
    bond_drop_rate: float = 0.0


@dataclass(frozen=True)
class FinetunePreset:
    """A finetune's encoder (used where no checkpoint gives one), readout and training settings."""

    encoder: EncoderConfig
    readout: ReadoutConfig = field(default_factory=ReadoutConfig)
    training: TrainingDefaults = field(default_factory=TrainingDefaults)


@dataclass(frozen=True)
class PretrainPreset:
    """A pretraining's encoder and loss weights; its latent head and decoder are ``PretrainHeadsConfig``'s defaults
    (the vocab sizes come from the corpus)."""

    encoder: EncoderConfig
    loss: PretrainLossConfig = field(default_factory=PretrainLossConfig)


# Upstream main.py finetune's parser: --activation ReLU, where the release and pretrain_ddp.py use PReLU; a finetune
# builds only the atom-output branches it reads (--embedding_output_type atom).
UPSTREAM_FINETUNE = FinetunePreset(EncoderConfig(activation="ReLU", embedding_output_type="atom"))

# Upstream pretrain_ddp.py's parser: --depth 3, where the finetune parser and the release use 6. Its --hidden_size 3
# is unusable (every run passes one, e.g. 800), so the release's 800 stands in for it.
UPSTREAM_PRETRAIN = PretrainPreset(EncoderConfig(depth=3))


@dataclass(frozen=True)
class FromScratchTraining:
    """What a finetune without a checkpoint trains with where the user sets nothing (issue 38's recipe, chosen on
    validation scores of FreeSolv and solubility scaffold splits: docs/finetuning.md#from-scratch). Upstream's
    defaults suit a pretrained 800-wide encoder; a model that starts from nothing on a few thousand molecules needs
    molecule descriptors it can lean on from the first epoch and a model sized to the data. Field names are
    `kermt finetune`'s settings; a finetune from a checkpoint keeps the flags' own (upstream's) defaults."""

    # descriptors in the head: alone they predict about as well as the graph (the bench's MLP column)
    features_generator: tuple[str, ...] = ("rdkit_2d_normalized",)
    ffn_hidden_size: int = 256
    # upstream's 30 epochs decaying from 1e-3 leave a model that starts from nothing underfit (its training loss
    # still falling, its best epoch the last)
    epochs: int = 60
    max_lr: float = 2e-3
    weight_decay: float = 1e-5

    def settings(self) -> dict[str, Any]:
        """The recipe as setting -> value (lists where the setting is a list)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# `kermt finetune` without a checkpoint: upstream finetune's encoder (ReLU, atom branches) sized to the data a user
# trains from scratch (the 800-wide, 38.7 M-parameter release size overfits a few thousand molecules and trains at
# a few molecules per second on a CPU), with zero padding, so that a molecule's number depends on the molecule and
# the model only (docs/numerics.md#padding-modes; --padding upstream for upstream's own numerics). A finetune from a
# checkpoint keeps the checkpoint's architecture and padding.
FROM_SCRATCH: EncoderConfig = replace(UPSTREAM_FINETUNE.encoder, hidden_size=64, depth=4, padding="zero")
FROM_SCRATCH_TRAINING = FromScratchTraining()

# The neighbour width W an upstream-padded model that records none (upstream's own checkpoints) computes each
# molecule at (at least; kermt.inference.widths): the width nearly every batch of 32 drug-like molecules takes
# upstream, so molecules of degree <= 4 get upstream's batch-32 numbers: on upstream's three fixture checkpoints
# W = 4 gave every molecule its batch-32 number, W = 1-3 and 5-6 moved them by 0.1-1.4 std on average; on models
# finetuned from an encoder pretrained here on MOSES, W = 4 also gave the lowest test RMSE on every scaffold split
# (demo logP 0.42 against 1.00-2.49 at other widths; solubility 1.44 against 1.79-4.51)
# (bench/reference_width.py [--held_out], docs/numerics.md#batch-composition). The released models were not measured.
UPSTREAM_REFERENCE_WIDTH: int = 4

# Upstream main.py predict/fingerprint read the same --batch_size default as its finetune (kermt predict, eval,
# fingerprint, embed and kermt.load_run).
PREDICT_BATCH_SIZE: int = UPSTREAM_FINETUNE.training.batch_size


__all__ = ["FROM_SCRATCH", "FROM_SCRATCH_TRAINING", "FromScratchTraining", "PREDICT_BATCH_SIZE", "FinetunePreset",
           "PretrainPreset", "TrainingDefaults", "UPSTREAM_FINETUNE", "UPSTREAM_PRETRAIN", "UPSTREAM_REFERENCE_WIDTH"]
