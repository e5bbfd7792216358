"""Molecules drawn with RDKit's 2D depiction (rdMolDraw2D), as SVG data URIs the page shows as ``<img>``.

An ``<img>`` rather than inline SVG: RDKit's drawings of different molecules reuse the same element classes, and an
image keeps each drawing's styles to itself.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from rdkit import Chem
from rdkit.Chem.Draw import rdMolDraw2D
from rdkit.rdBase import BlockLogs

from ray_app.common.atom_colours import Colour, draw_molecule


def molecule_svg(smiles: str, width: int = 220, height: int = 160,
                 atom_colours: Mapping[int, Colour] | None = None) -> str | None:
    """The drawing of ``smiles`` as SVG text, or None when RDKit cannot parse it. ``atom_colours``: a disc of that
    colour behind each atom index given (RDKit's parse order); the element letters are then drawn in black, so
    that an oxygen's red or a nitrogen's blue cannot be read as the discs' meaning."""
    with BlockLogs():  # a SMILES RDKit cannot parse is shown as text; its parse error is no news to the reader
        molecule = Chem.MolFromSmiles(smiles)
    if molecule is None:
        return None
    drawer = rdMolDraw2D.MolDraw2DSVG(width, height)
    drawer.drawOptions().clearBackground = True
    draw_molecule(drawer, molecule, atom_colours)
    drawer.FinishDrawing()
    return drawer.GetDrawingText()


def molecule_uri(smiles: str, width: int = 220, height: int = 160,
                 atom_colours: Mapping[int, Colour] | None = None) -> str | None:
    svg = molecule_svg(smiles, width, height, atom_colours)
    return None if svg is None else svg_uri(svg)


def svg_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")


__all__ = ["Colour", "molecule_svg", "molecule_uri", "svg_uri"]
