"""The page's files (package data): the route prefix it runs under goes into its links, escaped; only the listed
assets are served; nothing is fetched from another host."""

from __future__ import annotations

import re
from importlib import resources

import pytest
from fastapi import HTTPException

from ray_app.serve.page import ASSETS, asset_response, page_html


def test_the_route_prefix_goes_into_the_links_escaped():
    assert 'src="/kermt/static/page.js"' in page_html("/kermt/") and 'content="/kermt"' in page_html("/kermt")
    assert 'src="/static/page.js"' in page_html("") and "__ROOT__" not in page_html("/")
    hostile = page_html('/x"><script>alert(1)</script>')
    assert "<script>alert" not in hostile and "&quot;&gt;&lt;script&gt;" in hostile


def test_only_the_listed_assets_are_served_and_none_reaches_another_host():
    static = resources.files("ray_app.serve").joinpath("static")
    assert sorted(p.name for p in static.iterdir()) == sorted([*ASSETS, "index.html"])
    for name in [*ASSETS, "index.html"]:
        text = static.joinpath(name).read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text, re.IGNORECASE), name  # no CDN, no fonts
    for script in ("page.js", "attributions.js"):
        assert ".innerHTML" not in static.joinpath(script).read_text()  # text goes in as text
    with pytest.raises(HTTPException) as error:
        asset_response("../app.py")
    assert error.value.status_code == 404
