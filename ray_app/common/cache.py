"""Where kermt keeps what it downloads or mirrors on this machine: ``$KERMT_CACHE``, else ``~/.cache/kermt``
(the release, fetched inputs, ``--save_dir`` mirrors of URIs)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_VARIABLE = "KERMT_CACHE"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE, Path.home() / ".cache" / "kermt"))


__all__ = ["CACHE_VARIABLE", "cache_root"]
