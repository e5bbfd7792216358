"""Molecule drawings: RDKit's SVG rebuilt from an allow-list, so text from a SMILES can never become markup."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ray_app.common.atom_colours import share_colour
from ray_app.serve.depict import depict_attributions, depict_svg, sanitize_svg

HOSTILE_SVG = (
    '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" onload="alert(1)" '
    'width="10" height="10"><script>alert(2)</script><text onclick="alert(3)">&lt;img src=x onerror=alert(4)&gt;'
    '</text><a xlink:href="javascript:alert(5)"><path d="M0 0"/></a><rect style="fill:url(http://evil/x)" '
    'width="1"/><foreignObject><div xmlns="http://www.w3.org/1999/xhtml">x</div></foreignObject>'
    '<image xlink:href="http://evil/y.png"/><path d="M 1 1 L 2 2" stroke="#000"/></svg>')


def test_scripts_handlers_links_and_external_references_are_dropped():
    clean = sanitize_svg(HOSTILE_SVG)
    lowered = clean.lower()
    for bad in ("<script", "onload", "onclick", "javascript:", "url(", "foreignobject", "<image", "href", "<a "):
        assert bad not in lowered, bad
    root = ET.fromstring(clean)
    assert root.find("{http://www.w3.org/2000/svg}text").text == "<img src=x onerror=alert(4)>"  # text, escaped
    assert "&lt;img" in clean and root.find("{http://www.w3.org/2000/svg}path").get("d") == "M 1 1 L 2 2"


def test_a_cxsmiles_label_with_markup_is_drawn_without_it():
    svg = depict_svg("CCO |$<script>alert(1)</script>;;$|")
    assert svg.startswith("<svg") and "<path" in svg and "<script" not in svg.lower()
    assert ET.fromstring(svg).get("width") == "200px"


def test_an_invalid_or_empty_smiles_has_no_drawing():
    assert depict_svg("not_a_smiles") is None and depict_svg("") is None


def _hex(colour: tuple[float, float, float]) -> str:  # as RDKit writes a colour: each channel truncated
    return "#" + "".join(f"{int(c * 255):02X}" for c in colour)


def test_attribution_discs_are_red_where_an_atom_raises_blue_where_it_lowers_white_at_zero():
    assert share_colour(1.0) == pytest.approx((1.0, 0.15, 0.15))
    assert share_colour(-1.0) == pytest.approx((0.15, 0.15, 1.0))
    assert share_colour(0.0) == (1.0, 1.0, 1.0) and share_colour(0.5)[1] == share_colour(-0.5)[0]
    svg = depict_attributions("c1ccccc1O", [0.0, 0.0, 0.0, 0.0, 0.0, 0.4, -0.2])  # scaled to the largest, 0.4
    assert _hex(share_colour(1.0)) in svg and _hex(share_colour(-0.5)) in svg and "<script" not in svg
    assert depict_attributions("c1ccccc1O", [0.1] * 6) is None  # not one value per heavy atom
    assert depict_attributions("not_a_smiles", [0.1]) is None
