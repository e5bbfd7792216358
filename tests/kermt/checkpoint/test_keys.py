"""Encoder output-branch keys: the prefixes come from the encoder's branch names, and every atom-branch key of
upstream's released layout has its bond-branch twin in that layout (what export writes for a finetuned model)."""

from __future__ import annotations

import pytest

from kermt.checkpoint.keys import ATOM_BRANCH_PREFIXES, BOND_BRANCH_PREFIXES, bond_branch_key
from tests.conftest import FIXTURE_DIR


def _released_keys() -> list[str]:
    text = (FIXTURE_DIR / "keys_full_finetune_release_readme.txt").read_text()
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return [line.split()[0].replace("grover.", "kermt.", 1) for line in lines]


def test_every_atom_branch_key_has_its_bond_twin_in_the_released_layout():
    keys = set(_released_keys())
    atom = sorted(k for k in keys if k.startswith(ATOM_BRANCH_PREFIXES))
    bond = sorted(k for k in keys if k.startswith(BOND_BRANCH_PREFIXES))
    assert atom and len(atom) == len(bond)
    assert sorted(bond_branch_key(k) for k in atom) == bond
    assert bond_branch_key("kermt.encoders.ffn_atom_from_bond.W_1.weight") == (
        "kermt.encoders.ffn_bond_from_bond.W_1.weight")


def test_a_key_outside_the_atom_branches_is_refused():
    with pytest.raises(ValueError, match="not a key of an encoder atom-output branch"):
        bond_branch_key("kermt.encoders.ffn_bond_from_atom.W_1.weight")
