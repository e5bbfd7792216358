"""The flag every command that featurises molecules offers next to its batch settings: ``--max_heavy_atoms``."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from kermt.registry import DEFAULT_MAX_HEAVY_ATOMS  # not kermt.chem: settings load without RDKit


def max_heavy_atoms_field() -> Any:
    """A fresh pydantic field for ``max_heavy_atoms`` (one per settings class)."""
    return Field(DEFAULT_MAX_HEAVY_ATOMS, ge=1, description="a molecule with more heavy atoms is an invalid row "
                 "(error 'too large: ...'), decided from the SMILES before any featurisation, so one huge molecule "
                 "cannot stall the run; 200 is more than any small-molecule drug has (docs/inputs.md)")


__all__ = ["max_heavy_atoms_field"]
