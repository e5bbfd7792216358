"""Molecules drawn with RDKit's 2D depiction (rdMolDraw2D), as SVG data URIs the page shows as ``<img>``.

An ``<img>`` rather than inline SVG: RDKit's drawings of different molecules reuse the same element classes, and an
image keeps each drawing's styles to itself.
"""

from __future__ import annotations

import base64

from rdkit import Chem
from rdkit.Chem.Draw import rdMolDraw2D
from rdkit.rdBase import BlockLogs


def molecule_svg(smiles: str, width: int = 220, height: int = 160) -> str | None:
    """The drawing of ``smiles`` as SVG text, or None when RDKit cannot parse it."""
    with BlockLogs():  # a SMILES RDKit cannot parse is shown as text; its parse error is no news to the reader
        molecule = Chem.MolFromSmiles(smiles)
    if molecule is None:
        return None
    drawer = rdMolDraw2D.MolDraw2DSVG(width, height)
    drawer.drawOptions().clearBackground = True
    rdMolDraw2D.PrepareAndDrawMolecule(drawer, molecule)
    drawer.FinishDrawing()
    return drawer.GetDrawingText()


def molecule_uri(smiles: str, width: int = 220, height: int = 160) -> str | None:
    svg = molecule_svg(smiles, width, height)
    return None if svg is None else "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")


__all__ = ["molecule_svg", "molecule_uri"]
