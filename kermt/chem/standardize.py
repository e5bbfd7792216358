"""What a molecule goes through before featurisation: the heavy-atom limit and the model's standardisation.

A model records how its molecules were standardised (``FeatureSettings.standardize`` in its checkpoint spec) and
every prediction applies the same, so a sodium salt gets its parent acid's number. ``parent``: RDKit
rdMolStandardize's largest organic fragment, neutralised where possible (no tautomer canonicalisation: it changes
molecules a chemist drew on purpose, and costs milliseconds a molecule). ``none``: the molecule as parsed, what
upstream's checkpoints were trained on.

Deterministic and cheap: a molecule of one fragment and no charged atom (nearly every row of a screening library)
is returned as parsed, untouched; any other is standardised, and if its canonical SMILES changed, re-parsed from
that SMILES, so the model sees exactly the molecule that SMILES describes (the salt and the acid featurise alike).
"""

from __future__ import annotations

from dataclasses import dataclass

from rdkit import Chem
from rdkit.Chem.MolStandardize import rdMolStandardize

from kermt.errors import UserError
from kermt.chem.validation import quiet_rdkit  # thread by thread, not process-wide
from kermt.registry import (DEFAULT_MAX_HEAVY_ATOMS, FINETUNE_STANDARDIZATION, STANDARDIZATIONS,
                            UNRECORDED_STANDARDIZATION, Standardization)

_CHOOSER = rdMolStandardize.LargestFragmentChooser(preferOrganic=True)
_UNCHARGER = rdMolStandardize.Uncharger()


def check_standardization(value: object, where: str = "--standardize") -> Standardization:
    """``value`` when it names a standardisation, else a one-line UserError naming ``where`` (a flag or key)."""
    if value not in STANDARDIZATIONS:
        raise UserError(f"{where} {value!r} is not one of {', '.join(STANDARDIZATIONS)}")
    return value  # type: ignore[return-value]  # checked above: one of the Literal's names


def check_max_heavy_atoms(value: object, where: str = "--max_heavy_atoms") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{where} {value!r}: must be a whole number of heavy atoms, at least 1")
    return value


@dataclass(frozen=True)
class MoleculePrep:
    """How each SMILES becomes the molecule a model sees: rejected above ``max_heavy_atoms`` heavy atoms (decided
    from the parse alone), then standardised as ``standardize`` says. The library's default standardises nothing
    (upstream's behaviour); a model's own setting comes from its checkpoint."""

    standardize: Standardization = UNRECORDED_STANDARDIZATION
    max_heavy_atoms: int = DEFAULT_MAX_HEAVY_ATOMS

    def __post_init__(self) -> None:
        check_standardization(self.standardize, "standardize")
        check_max_heavy_atoms(self.max_heavy_atoms, "max_heavy_atoms")

    @property
    def standardizes(self) -> bool:
        """Whether a molecule may differ from its input: then every output says what the model saw
        (``model_smiles``)."""
        return self.standardize != UNRECORDED_STANDARDIZATION


def standardize(mol: Chem.Mol, how: Standardization) -> tuple[Chem.Mol, str]:
    """(the molecule the model sees, its SMILES when it differs from ``mol``'s, else "").

    The parent is the largest organic fragment, neutralised. Where the neutral form is no molecule RDKit can read
    back (ferrocene's cyclopentadienide uncharges to 'c1cccc1', which cannot be kekulised), the charged fragment is
    the parent, and where that does not parse either, the molecule as given: standardisation never turns a valid
    row into an invalid one."""
    if how == "none" or not _needs_parent(mol):
        return mol, ""
    with quiet_rdkit():
        before = Chem.MolToSmiles(mol)
        fragment = _CHOOSER.choose(mol)
        for parent in (_UNCHARGER.uncharge(fragment), fragment):
            after = Chem.MolToSmiles(parent)
            if after == before:
                return mol, ""
            parsed = Chem.MolFromSmiles(after)
            if parsed is not None:
                return parsed, after
    return mol, ""


def _needs_parent(mol: Chem.Mol) -> bool:
    """Whether ``parent`` could change ``mol``: it has several fragments or a charged atom."""
    return len(Chem.GetMolFrags(mol)) > 1 or any(atom.GetFormalCharge() for atom in mol.GetAtoms())


__all__ = ["DEFAULT_MAX_HEAVY_ATOMS", "FINETUNE_STANDARDIZATION", "MoleculePrep", "UNRECORDED_STANDARDIZATION",
           "check_max_heavy_atoms", "check_standardization", "standardize"]
