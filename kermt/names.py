"""The "did you mean" hint of every error about a misspelt name (a setting, a config key, a column, a choice)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, valid: Iterable[object]) -> str:
    """`` (did you mean 'closest'?)`` for the valid name closest to ``name``, or "" when none is close: the tail of
    a one-line error, e.g. ``f"unknown key {key!r}{did_you_mean(key, fields)}"``."""
    close = difflib.get_close_matches(name, [str(v) for v in valid], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


__all__ = ["did_you_mean"]
