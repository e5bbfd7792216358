"""State-dict key groups of upstream KERMT / GROVER checkpoints and their canonical (our) names.

Our module names equal upstream's, so the only renames are the legacy GROVER prefix (``grover.`` -> ``kermt.``) and
the cMIM latent head's copy of the encoder (``latent_dist.kermt.*`` -> ``kermt.*``). Unlike upstream, which replaces
the substrings "grover" and "latent_dist." anywhere in a key (turning ``latent_dist.readout.*`` into the finetune
``readout.*``), renames here apply to whole leading prefixes only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kermt.nn.encoder import ATOM_BRANCHES, BOND_BRANCHES

ENCODER_PREFIX = "kermt."
LEGACY_ENCODER_PREFIX = "grover."
LATENT_ENCODER_PREFIX = "latent_dist.kermt."
LEGACY_LATENT_ENCODER_PREFIX = "latent_dist.grover."

TASK_HEAD_PREFIXES = ("mol_atom_from_atom_ffn", "mol_atom_from_bond_ffn")  # task-specific ones share these stems
READOUT_PREFIX = "readout."
VOCAB_HEAD_PREFIXES = ("vocab_module.", "av_task_", "bv_task_", "fg_task_all.")
LATENT_HEAD_PREFIX = "latent_dist."
DECODER_PREFIX = "decoder."


def branch_prefixes(branch: str) -> tuple[str, str]:
    """The key prefixes of one encoder output branch (``atom_from_atom``...): its FFN and its sublayer."""
    return f"kermt.encoders.ffn_{branch}.", f"kermt.encoders.{branch}_sublayer."


ATOM_BRANCH_PREFIXES = tuple(prefix for branch in ATOM_BRANCHES for prefix in branch_prefixes(branch))
BOND_BRANCH_PREFIXES = tuple(prefix for branch in BOND_BRANCHES for prefix in branch_prefixes(branch))


def bond_branch_key(atom_key: str) -> str:
    """The key of the same layer in the bond-output branch that mirrors ``atom_key``'s atom-output branch
    (``atom_from_atom`` -> ``bond_from_atom``, ``atom_from_bond`` -> ``bond_from_bond``)."""
    for atom_branch, bond_branch in zip(ATOM_BRANCHES, BOND_BRANCHES):
        for atom_prefix, bond_prefix in zip(branch_prefixes(atom_branch), branch_prefixes(bond_branch)):
            if atom_key.startswith(atom_prefix):
                return bond_prefix + atom_key[len(atom_prefix):]
    raise ValueError(f"{atom_key!r} is not a key of an encoder atom-output branch")


@dataclass(frozen=True)
class KeyGroup:
    """A named set of keys (by prefix) and why a model may not use them."""

    name: str
    prefixes: tuple[str, ...]
    unused_reason: str

    def matches(self, key: str) -> bool:
        return key.startswith(self.prefixes)


# Order matters: the first matching group names a key.
KEY_GROUPS: tuple[KeyGroup, ...] = (
    KeyGroup("encoder_atom_branches", ATOM_BRANCH_PREFIXES,
             "encoder atom-output branch, not built by this model (embedding_output_type)"),
    KeyGroup("encoder_bond_branches", BOND_BRANCH_PREFIXES,
             "encoder bond-output branch, not built by this model (a finetune model only uses the atom outputs)"),
    KeyGroup("encoder", (ENCODER_PREFIX,), "encoder, not part of this model"),
    KeyGroup("latent_encoder_copy", (LATENT_ENCODER_PREFIX,),
             "second copy of the shared encoder in a cMIM/hybrid checkpoint (verified identical to kermt.*)"),
    KeyGroup("latent_head", (LATENT_HEAD_PREFIX,),
             "cMIM latent head (pretraining only; its readout is not the finetune readout, so it is not loaded "
             "into it, unlike upstream)"),
    KeyGroup("smiles_decoder", (DECODER_PREFIX,), "cMIM SMILES decoder (pretraining only)"),
    KeyGroup("vocab_heads", VOCAB_HEAD_PREFIXES,
             "contextual-vocabulary pretraining heads (pretraining only)"),
    KeyGroup("readout", (READOUT_PREFIX,), "finetune readout, not part of this model"),
    KeyGroup("task_heads", TASK_HEAD_PREFIXES, "finetune FFN heads, not part of this model"),
)
OTHER_GROUP = KeyGroup("other", (), "not a known KERMT key")


def group_of(key: str) -> KeyGroup:
    """The :data:`KEY_GROUPS` entry a canonical key belongs to (``OTHER_GROUP`` when none)."""
    for group in KEY_GROUPS:
        if group.matches(key):
            return group
    return OTHER_GROUP


def canonical_key(key: str) -> str:
    """Legacy GROVER prefixes renamed to KERMT's (``grover.x`` -> ``kermt.x``); everything else unchanged."""
    if key.startswith(LEGACY_ENCODER_PREFIX):
        return ENCODER_PREFIX + key[len(LEGACY_ENCODER_PREFIX):]
    if key.startswith(LEGACY_LATENT_ENCODER_PREFIX):
        return LATENT_ENCODER_PREFIX + key[len(LEGACY_LATENT_ENCODER_PREFIX):]
    return key


def canonical_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename legacy keys; a cMIM checkpoint whose only encoder is ``latent_dist.kermt.*`` gets it as ``kermt.*``.

    When both copies exist (hybrid), they must hold identical values (one shared module upstream); the
    ``latent_dist.kermt.*`` copy is kept under its own name so callers can report it as ignored.
    """
    renamed: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        new_key = canonical_key(key)
        if new_key in renamed:
            raise ValueError(f"checkpoint holds both {key!r} and its canonical name {new_key!r}")
        renamed[new_key] = tensor
    latent = {k[len(LATENT_ENCODER_PREFIX):]: t for k, t in renamed.items() if k.startswith(LATENT_ENCODER_PREFIX)}
    if not latent:
        return renamed
    encoder = {k[len(ENCODER_PREFIX):]: t for k, t in renamed.items() if k.startswith(ENCODER_PREFIX)}
    if not encoder:
        renamed.update({ENCODER_PREFIX + k: t for k, t in latent.items()})
        return renamed
    _check_encoder_copies_equal(encoder, latent)
    return renamed


def _check_encoder_copies_equal(encoder: dict[str, torch.Tensor], latent: dict[str, torch.Tensor]) -> None:
    if encoder.keys() != latent.keys():
        only = sorted(encoder.keys() ^ latent.keys())[:3]
        raise ValueError(
            f"kermt.* and latent_dist.kermt.* hold different keys (e.g. {only}); expected one shared encoder")
    for name, tensor in encoder.items():
        if tensor.shape != latent[name].shape or not torch.equal(tensor, latent[name]):
            raise ValueError(
                f"kermt.{name} and latent_dist.kermt.{name} differ; a hybrid checkpoint shares one encoder, "
                "so this file is inconsistent"
            )


def group_counts(keys: list[str], state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, dict[str, int]]:
    """Per group: number of tensors (and elements when ``state_dict`` is given)."""
    counts: dict[str, dict[str, int]] = {}
    for key in keys:
        entry = counts.setdefault(group_of(key).name, {"tensors": 0, "elements": 0})
        entry["tensors"] += 1
        if state_dict is not None:
            entry["elements"] += state_dict[key].numel()
    return counts
