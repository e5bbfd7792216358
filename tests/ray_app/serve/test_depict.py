"""Molecule drawings: RDKit's SVG rebuilt from an allow-list, so text from a SMILES can never become markup."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ray_app.serve.depict import depict_svg, sanitize_svg

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
