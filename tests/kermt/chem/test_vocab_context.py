"""The whole-molecule context pass (molecule_contexts, with its per-process cache of joined strings) against a
plain per-atom / per-bond reading of the definition in kermt.chem.vocab_context's docstring."""

from __future__ import annotations

from collections import Counter

import pytest
from rdkit import Chem

from kermt.chem import vocab_context
from kermt.chem.vocab_context import bonds_in_pair_order, contexts, molecule_contexts

# stereo and direction (F/C=C/F), a quaternary carbon (one key counted 4 times), aromatic and charged atoms,
# a triple bond, several fragments, an isotope, a lone atom
MOLECULES = ["F/C=C/F", "F/C=C\\F", "CC(C)(C)C", "C[C@H](N)C(=O)O", "c1ccc2[nH]ccc2c1", "[O-][N+](=O)c1ccccc1",
             "C#N", "[Na+].[Cl-]", "[2H]C(Cl)Br", "C", "O=C1CCCC(=O)N1C/C=C/c1ccccc1"]


def _by_definition(mol: Chem.Mol) -> tuple[list[str], list[str]]:
    def joined(head: str, keys: list[str]) -> str:
        counts = Counter(keys)
        return head + "".join(f"_{key}{counts[key]}" for key in sorted(counts))

    def descriptor(bond: Chem.Bond) -> str:
        return f"({bond.GetBondType()}-{bond.GetStereo()}-{bond.GetBondDir()})"

    atoms = [joined(a.GetSymbol(), [f"{b.GetOtherAtom(a).GetSymbol()}-{b.GetBondType()}" for b in a.GetBonds()])
             for a in mol.GetAtoms()]
    def around(bond: Chem.Bond) -> list[str]:  # every other bond at either end, named from that end
        return [f"{end.GetSymbol()}-{descriptor(other)}" for end in (bond.GetBeginAtom(), bond.GetEndAtom())
                for other in end.GetBonds() if other.GetIdx() != bond.GetIdx()]

    bonds = [joined(descriptor(bond), around(bond)) for bond in bonds_in_pair_order(mol)]
    return atoms, bonds


@pytest.mark.parametrize("smiles", MOLECULES)
def test_molecule_contexts_follow_the_definition(smiles: str) -> None:
    mol = Chem.MolFromSmiles(smiles)
    expected = _by_definition(mol)
    assert molecule_contexts(mol) == expected
    assert (contexts(mol, "atom"), contexts(mol, "bond")) == expected


def test_contexts_are_the_same_when_the_join_cache_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vocab_context, "_joined", {})  # start empty: the other tests filled it
    monkeypatch.setattr(vocab_context, "_JOINED_LIMIT", 2)  # cleared every couple of strings
    mols = [Chem.MolFromSmiles(s) for s in MOLECULES]
    assert [molecule_contexts(m) for m in mols] == [_by_definition(m) for m in mols]
    assert len(vocab_context._joined) <= 2
