from __future__ import annotations

import base64

from ray_app.report.molecules import molecule_svg, molecule_uri


def test_molecule_drawn_as_svg_and_unparsable_smiles_is_none():
    svg = molecule_svg("c1ccccc1O", 220, 160)
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "width='220px'" in svg
    assert base64.b64decode(molecule_uri("c1ccccc1O").split(",", 1)[1]).decode() == svg
    assert molecule_svg("not_a_smiles") is None and molecule_uri("C1CC") is None
