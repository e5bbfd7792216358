"""The "did you mean" hint of every error about a misspelt name (a setting, a config key, a column, a choice), and
of a level given as a percentage."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from kermt.errors import UserError


def did_you_mean(name: str, valid: Iterable[object]) -> str:
    """`` (did you mean 'closest'?)`` for the valid name closest to ``name``, or "" when none is close: the tail of
    a one-line error, e.g. ``f"unknown key {key!r}{did_you_mean(key, fields)}"``."""
    close = difflib.get_close_matches(name, [str(v) for v in valid], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def level_not_percentage(value: object, name: str = "") -> object:
    """``value`` unchanged, unless it reads as a percentage where a level in (0, 1) is expected (``--interval 90``):
    then a UserError that names the fraction (``name``: how the message names the value, e.g. ``interval=``).
    Other values out of range (1.5 is no likely percentage) are left to the caller's bounds."""
    try:
        number = float(value)  # a YAML file may quote it
    except (TypeError, ValueError):
        return value
    if 10 <= number < 100:
        raise UserError(f"{name}{number:g} is a percentage, but a level is a fraction in (0, 1): did you mean "
                        f"{number / 100:g}?")
    return value


__all__ = ["did_you_mean", "level_not_percentage"]
