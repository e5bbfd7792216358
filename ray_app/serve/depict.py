"""Molecule drawings for the page: RDKit's SVG, rebuilt from an allow-list so that nothing from a SMILES can run;
with attributions, the atoms coloured by their shares (red raises the prediction, blue lowers it).

A SMILES carries text that RDKit may draw (CXSMILES atom labels such as ``|$<script>...$|``). RDKit draws labels as
paths today, but the page must not depend on that: the SVG is parsed and rebuilt keeping only drawing elements
and presentation attributes (no ``script``, ``foreignObject``, event handlers, links or external references);
text is re-escaped on output. The page then shows it through an ``<img>`` data URL, where an SVG never runs
script at all (a second wall).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from collections.abc import Sequence

from rdkit import Chem, RDLogger
from rdkit.Chem.Draw import rdMolDraw2D

from kermt.inference.columns import ATOMS_SUFFIX, MODEL_SMILES_COLUMN
from ray_app.common.atom_colours import Colour, draw_molecule, share_colour

SVG_KEY, ATTRIBUTION_SVG_KEY = "svg", "attribution_svg"  # a response entry's drawings ("depict": true)
SVG_NS = "http://www.w3.org/2000/svg"
DRAWING_SIZE = (200, 140)  # pixels: a table cell's molecule
ALLOWED_ELEMENTS = {"svg", "g", "rect", "path", "line", "polyline", "polygon", "circle", "ellipse", "text", "tspan"}
ALLOWED_ATTRIBUTES = {
    "width", "height", "viewBox", "x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "rx", "ry", "d", "points",
    "fill", "stroke", "stroke-width", "style", "class", "font-size", "font-family", "font-weight", "text-anchor",
    "dominant-baseline", "opacity", "fill-opacity", "stroke-opacity", "fill-rule", "transform", "version",
}
# a style may only hold plain declarations: no url(...) (an external fetch), no expression(...), no @import
UNSAFE_STYLE = re.compile(r"url\s*\(|expression\s*\(|@import|javascript:|[<>\\]", re.IGNORECASE)

ET.register_namespace("", SVG_NS)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _clean(element: ET.Element) -> ET.Element | None:
    """A copy of ``element`` with only allowed elements and attributes (None: the element is dropped whole)."""
    name = _local(element.tag) if isinstance(element.tag, str) else ""
    if name not in ALLOWED_ELEMENTS:
        return None
    out = ET.Element(f"{{{SVG_NS}}}{name}")
    for key, value in element.attrib.items():
        if "}" not in key and key in ALLOWED_ATTRIBUTES and not UNSAFE_STYLE.search(value):
            out.set(key, value)
    out.text = element.text if name in ("text", "tspan") else None
    for child in element:
        cleaned = _clean(child)
        if cleaned is not None:
            cleaned.tail = child.tail if name in ("text", "tspan") else None
            out.append(cleaned)
    return out


def sanitize_svg(svg: str) -> str:
    """``svg`` rebuilt from the allow-list (a ValueError when it is not an SVG document)."""
    svg = re.sub(r"^\s*<\?xml[^>]*\?>", "", svg)  # its encoding declaration would make a str unparseable
    root = ET.fromstring(svg)
    cleaned = _clean(root)
    if cleaned is None or _local(root.tag) != "svg":
        raise ValueError("not an SVG document")
    return ET.tostring(cleaned, encoding="unicode")


def _molecule(smiles: str) -> Chem.Mol | None:
    RDLogger.DisableLog("rdApp.*")  # an invalid SMILES is reported by the prediction's error, not on stderr
    try:
        molecule = Chem.MolFromSmiles(smiles)
    finally:
        RDLogger.EnableLog("rdApp.*")
    return None if molecule is None or molecule.GetNumAtoms() == 0 else molecule


def _drawn(molecule: Chem.Mol, size: tuple[int, int], atom_colours: dict[int, Colour] | None = None) -> str:
    drawer = rdMolDraw2D.MolDraw2DSVG(*size)
    draw_molecule(drawer, molecule, atom_colours)
    drawer.FinishDrawing()
    return sanitize_svg(drawer.GetDrawingText())


def depict_svg(smiles: str, size: tuple[int, int] = DRAWING_SIZE) -> str | None:
    """The molecule drawn as a sanitised SVG string, or None when RDKit cannot read ``smiles``."""
    molecule = _molecule(smiles)
    return None if molecule is None else _drawn(molecule, size)


def depict_attributions(smiles: str, values: Sequence[float], size: tuple[int, int] = DRAWING_SIZE) -> str | None:
    """The molecule drawn with a disc behind each atom coloured by its attribution (:func:`share_colour`, scaled
    to the molecule's largest absolute value), as a sanitised SVG string; None when
    RDKit cannot read ``smiles`` or the values are not one per heavy atom of it (``values[i]`` is atom ``i`` of
    RDKit's parse of ``smiles``: the SMILES the model saw)."""
    molecule = _molecule(smiles)
    if molecule is None or molecule.GetNumAtoms() != len(values):
        return None
    scale = max(abs(v) for v in values) or 1.0
    atoms = {i: share_colour(v / scale) for i, v in enumerate(values)}
    return _drawn(molecule, size, atoms)


def depictions(entry: dict, attributed_tasks: Sequence[str]) -> dict:
    """A response entry's drawings: ``svg`` (the input molecule; null when invalid) and, for each of
    ``attributed_tasks``, ``attribution_svg[task]``: the molecule the model saw (``model_smiles`` where its
    standardisation changed the input) coloured by ``<task>_atoms``, null where the entry has none."""
    out: dict = {SVG_KEY: depict_svg(entry["smiles"]) if entry["valid"] else None}
    if attributed_tasks:
        seen = entry.get(MODEL_SMILES_COLUMN) or entry["smiles"]
        out[ATTRIBUTION_SVG_KEY] = {task: depict_attributions(seen, entry[task + ATOMS_SUFFIX])
                                    if entry.get(task + ATOMS_SUFFIX) else None for task in attributed_tasks}
    return out


__all__ = ["ATTRIBUTION_SVG_KEY", "SVG_KEY", "depict_attributions", "depict_svg", "depictions", "sanitize_svg"]
