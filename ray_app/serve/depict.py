"""Molecule drawings for the page: RDKit's SVG, rebuilt from an allow-list so that nothing from a SMILES can run.

A SMILES carries text that RDKit may draw (CXSMILES atom labels such as ``|$<script>...$|``). RDKit draws labels as
paths today, but the page must not depend on that: the SVG is parsed and rebuilt keeping only drawing elements
and presentation attributes (no ``script``, ``foreignObject``, event handlers, links or external references);
text is re-escaped on output. The page then shows it through an ``<img>`` data URL, where an SVG never runs
script at all (a second wall).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from rdkit import Chem, RDLogger
from rdkit.Chem.Draw import rdMolDraw2D

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


def depict_svg(smiles: str, size: tuple[int, int] = DRAWING_SIZE) -> str | None:
    """The molecule drawn as a sanitised SVG string, or None when RDKit cannot read ``smiles``."""
    RDLogger.DisableLog("rdApp.*")  # an invalid SMILES is reported by the prediction's error, not on stderr
    try:
        molecule = Chem.MolFromSmiles(smiles)
    finally:
        RDLogger.EnableLog("rdApp.*")
    if molecule is None or molecule.GetNumAtoms() == 0:
        return None
    drawer = rdMolDraw2D.MolDraw2DSVG(*size)
    rdMolDraw2D.PrepareAndDrawMolecule(drawer, molecule)
    drawer.FinishDrawing()
    return sanitize_svg(drawer.GetDrawingText())


__all__ = ["depict_svg", "sanitize_svg"]
