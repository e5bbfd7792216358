"""``--objective``: what scores a molecule, written ``KIND:WHAT``.

- ``lookup:FILE[:COLUMN]``: scores known in advance (a retrospective study, a benchmark): FILE is a CSV with the
  SMILES in its first column (or one named ``smiles``) and the scores in COLUMN (default: the first other column).
  A FILE that is a URI (``s3://...``) keeps its colons; the text after the last colon is a COLUMN only when it
  holds no ``/``.
- ``command:PROGRAM``: an external scorer (a docking script): PROGRAM, with any arguments of its own, is run as
  ``PROGRAM INPUT OUTPUT`` where INPUT holds one SMILES a line and OUTPUT is a CSV it writes, ``smiles,score``.
- ``python:MODULE:FUNCTION``: a function of a list of SMILES returning one score each (None or NaN: not scored).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

from kermt.errors import UserError

ObjectiveKind = Literal["lookup", "command", "python"]
OBJECTIVE_KINDS: tuple[str, ...] = ("lookup", "command", "python")
FORMS = "lookup:FILE[:COLUMN], command:PROGRAM or python:MODULE:FUNCTION"


@dataclass(frozen=True)
class ObjectiveSpec:
    """A parsed ``--objective``: ``kind`` and what it names (``path`` + ``column`` for a lookup, ``program`` the
    command's words, ``module`` + ``function`` for python)."""

    kind: ObjectiveKind
    text: str
    path: str | None = None
    column: str | None = None
    program: tuple[str, ...] = ()
    module: str | None = None
    function: str | None = None


def parse_objective(text: str) -> ObjectiveSpec:
    """``--objective`` text -> :class:`ObjectiveSpec`; a one-line error naming the form it should take."""
    kind, colon, rest = text.strip().partition(":")
    if not colon or kind not in OBJECTIVE_KINDS:
        raise UserError(f"--objective {text!r}: expected {FORMS}")
    if not rest.strip():
        raise UserError(f"--objective {text!r}: nothing after {kind}:; expected {FORMS}")
    if kind == "lookup":
        return _lookup(text, rest)
    if kind == "command":
        try:
            words = tuple(shlex.split(rest))
        except ValueError as error:
            raise UserError(f"--objective {text!r}: cannot split the command into words ({error})") from None
        return ObjectiveSpec("command", text, program=words)
    module, colon, function = rest.rpartition(":")
    if not colon or not module or not function.isidentifier():
        raise UserError(f"--objective {text!r}: expected python:MODULE:FUNCTION (e.g. python:my_scores:logp)")
    return ObjectiveSpec("python", text, module=module, function=function)


def _lookup(text: str, rest: str) -> ObjectiveSpec:
    path, colon, column = rest.rpartition(":")
    if not colon or not path or "/" in column:  # no COLUMN, or the colon of a URI's scheme
        return ObjectiveSpec("lookup", text, path=rest)
    if not column:
        raise UserError(f"--objective {text!r}: empty COLUMN after the last ':'; write lookup:FILE or "
                        "lookup:FILE:COLUMN")
    return ObjectiveSpec("lookup", text, path=path, column=column)


__all__ = ["FORMS", "OBJECTIVE_KINDS", "ObjectiveKind", "ObjectiveSpec", "parse_objective"]
