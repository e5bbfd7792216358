"""The page for chemists at ``GET /``: one HTML file, its script and style, shipped as package data
(``ray_app/serve/static/``) and served by the ingress, so the browser needs nothing but this server.

The page runs under the application's route prefix (``/`` or ``/<app_name>`` when it joins a running Serve), so
its HTML carries that prefix for its links and API calls. A strict Content-Security-Policy allows only this
server's script and style, and images from ``data:`` URLs (the molecule drawings).
"""

from __future__ import annotations

import html
from functools import lru_cache
from importlib import resources

from fastapi import HTTPException
from fastapi.responses import Response

ASSETS = {"page.js": "text/javascript; charset=utf-8", "attributions.js": "text/javascript; charset=utf-8",
          "page.css": "text/css; charset=utf-8"}
ROOT_MARK = "__ROOT__"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@lru_cache(maxsize=None)
def _static(name: str) -> str:
    return resources.files("ray_app.serve").joinpath("static", name).read_text(encoding="utf-8")


def page_html(root_path: str) -> str:
    return _static("index.html").replace(ROOT_MARK, html.escape(root_path.rstrip("/"), quote=True))


def page_response(root_path: str) -> Response:
    return Response(page_html(root_path), media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


def asset_response(asset: str) -> Response:
    if asset not in ASSETS:
        raise HTTPException(404, f"no static file {asset!r}")
    return Response(_static(asset), media_type=ASSETS[asset], headers=SECURITY_HEADERS)


__all__ = ["asset_response", "page_response"]
