"""The colours of per-atom attributions wherever a molecule is drawn with them (the reports' molecules and the
service's attribution_svg, so a chemist reads one convention): red where an atom raises the prediction,
blue where it lowers it, white at 0, deeper the larger its share of the drawing's scale."""

from __future__ import annotations

HIGHLIGHT_RADIUS = 0.4  # an atom's disc, in bond lengths (RDKit's default 0.3 leaves small discs on a 200 px drawing)
MAX_DEPTH = 0.85  # the largest atom's colour: 85 % of the way from white to pure red or blue (the atom stays legible)


def share_colour(share: float) -> tuple[float, float, float]:
    """RGB of an atom whose value is ``share`` of the scale's largest absolute value (-1..1, clipped): red where it
    raises the prediction, blue where it lowers it, white at 0."""
    depth = MAX_DEPTH * min(abs(share), 1.0)
    return (1.0, 1.0 - depth, 1.0 - depth) if share > 0 else (1.0 - depth, 1.0 - depth, 1.0)


__all__ = ["HIGHLIGHT_RADIUS", "MAX_DEPTH", "share_colour"]
