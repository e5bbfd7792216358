"""The colours of per-atom attributions wherever a molecule is drawn with them (the reports' molecules and the
service's attribution_svg, so a chemist reads one convention): red where an atom raises the prediction,
blue where it lowers it, white at 0, deeper the larger its share of the drawing's scale."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Colour = tuple[float, float, float]  # RGB in [0, 1]

HIGHLIGHT_RADIUS = 0.4  # an atom's disc, in bond lengths (RDKit's default 0.3 leaves small discs on a 200 px drawing)
MAX_DEPTH = 0.85  # the largest atom's colour: 85 % of the way from white to pure red or blue (the atom stays legible)


def share_colour(share: float) -> tuple[float, float, float]:
    """RGB of an atom whose value is ``share`` of the scale's largest absolute value (-1..1, clipped): red where it
    raises the prediction, blue where it lowers it, white at 0."""
    depth = MAX_DEPTH * min(abs(share), 1.0)
    return (1.0, 1.0 - depth, 1.0 - depth) if share > 0 else (1.0 - depth, 1.0 - depth, 1.0)


def draw_molecule(drawer: Any, molecule: Any, atom_colours: Mapping[int, Colour] | None = None) -> None:
    """``molecule`` drawn on an RDKit ``drawer``; with ``atom_colours``, a disc of that colour behind each atom index
    given (RDKit's parse order) and the element letters in black, so that an oxygen's red or a nitrogen's blue
    cannot be read as the discs' meaning."""
    from rdkit.Chem.Draw import rdMolDraw2D  # the drawing callers have RDKit loaded; this module's colours do not

    if atom_colours is None:
        rdMolDraw2D.PrepareAndDrawMolecule(drawer, molecule)
        return
    options = drawer.drawOptions()
    options.useBWAtomPalette()
    options.highlightRadius = HIGHLIGHT_RADIUS
    colours = {int(i): tuple(float(c) for c in rgb) for i, rgb in atom_colours.items()}
    rdMolDraw2D.PrepareAndDrawMolecule(drawer, molecule, highlightAtoms=list(colours), highlightAtomColors=colours,
                                       highlightBonds=[])


__all__ = ["Colour", "HIGHLIGHT_RADIUS", "MAX_DEPTH", "draw_molecule", "share_colour"]
