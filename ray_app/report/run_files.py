"""Tolerant readers of a run's files: a report covers what a run left, so a missing or unreadable file is
``None`` (the page says "not recorded"), never an error."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import yaml


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_yaml(path: Path) -> dict[str, Any] | None:
    try:
        record = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return record if isinstance(record, dict) else None


def read_rows(path: Path) -> list[dict[str, str]] | None:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except (OSError, csv.Error, UnicodeDecodeError):
        return None


def columns(rows: list[dict[str, str]]) -> dict[str, list[float]]:
    """The numeric columns of CSV rows (a blank cell is NaN; a column with any other text is left out)."""
    out: dict[str, list[float]] = {}
    for name in rows[0] if rows else ():
        try:
            out[name] = [float(r[name]) if r[name] not in ("", None) else float("nan") for r in rows]
        except (TypeError, ValueError):
            continue
    return out


__all__ = ["columns", "read_json", "read_rows", "read_yaml"]
