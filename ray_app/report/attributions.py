"""The molecules a report draws, coloured by per-atom attribution: each atom's share of the prediction
(:mod:`kermt.inference.attributions`, integrated gradients from an average drug-like atom), red where it raises the
prediction, blue where it lowers it, on one scale per task section, with a legend that says so.

Only the few drawn molecules are explained (a finetune's and eval's worst-predicted, a screen's top-ranked), in this
process, through the library (``kermt.load_run(model).predict(smiles, attributions=True)``): each by the model that
made the number beside it (a finetune's test molecule by its own fold's members), so the shares add up to it. A
model that cannot give them (one that needs --features_path, a run whose files are gone, a molecule over the
attributions' budget) leaves the plain drawing and a note that says why; the report is written either way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kermt.errors import first_line
from kermt.inference.columns import (ATOMS_SUFFIX, BASELINE_SUFFIX, DESCRIPTORS_SUFFIX, ERROR_COLUMN,
                                     MODEL_SMILES_COLUMN, SMILES_COLUMN)
from kermt.run_layout import ATTRIBUTIONS_FILE_SUFFIX, beside_output
from ray_app.common.atom_colours import share_colour
from ray_app.report import figures
from ray_app.report.molecules import molecule_uri
from ray_app.report.page import Legend, Section, fmt

UNCOLOURED_SHARE = 0.02  # atoms under 2 % of the scale get no disc: white is 0 on the key, and specks are noise
NO_MODEL = ("attributions not drawn: this report was built from the file alone (kermt eval --attributions, or kermt "
            "report FILE --checkpoint_dir MODEL, draws them)")


@dataclass(frozen=True)
class Explained:
    """One molecule's attribution to one task: ``atoms`` (one value per heavy atom of ``smiles``, the SMILES the
    model saw, in RDKit's parse order) + ``descriptors`` (0 without molecule descriptors) + ``baseline`` = ``total``,
    the model's value (a regression's prediction, a classifier's logit)."""

    smiles: str
    atoms: np.ndarray
    baseline: float
    descriptors: float

    @property
    def total(self) -> float:
        return self.baseline + float(self.atoms.sum()) + self.descriptors


@dataclass
class Explanations:
    """Attributions of a few molecules, per (model, SMILES) and task; ``why_not``: per model, or per (model,
    SMILES), why there are none."""

    values: dict[tuple[str, str], dict[str, Explained]] = field(default_factory=dict)
    why_not: dict[str | tuple[str, str], str] = field(default_factory=dict)
    seconds: float = 0.0

    def get(self, model: str | None, smiles: str, task: str) -> Explained | str:
        """The molecule's attribution to ``task``, or why there is none."""
        if model is None:
            return NO_MODEL
        found = self.values.get((model, smiles), {}).get(task)
        return found if found is not None else self.why_not.get((model, smiles)) or self.why_not.get(
            model, "attributions not drawn: the model gave none")


def explain(requests: Mapping[str, Sequence[str]], trust_checkpoint: bool = False) -> Explanations:
    """The attributions of each model's SMILES. A model is what ``kermt.load_run`` takes (a run's or fold's
    directory, or one checkpoint), or a file of attribution columns a run wrote (:func:`recorded_beside`), read
    instead of computed. Never raises: a model that cannot give them is recorded in ``why_not``."""
    found, started = Explanations(), time.perf_counter()
    for model, smiles in requests.items():
        unique = list(dict.fromkeys(smiles))
        if not unique:
            continue
        try:
            explain = _recorded if model.endswith(ATTRIBUTIONS_FILE_SUFFIX) else _computed
            rows, tasks = explain(model, unique, trust_checkpoint)
        except Exception as error:  # any: a report must never fail its run (module docstring)
            found.why_not[model] = f"attributions not drawn: {type(error).__name__}: {first_line(error)}"
            continue
        _keep(found, model, unique, rows, tasks)
    found.seconds = time.perf_counter() - started
    return found


def read_off_rows(source: str, rows: Mapping[str, dict], tasks: Sequence[str], smiles_column: str) -> Explanations:
    """The attributions in rows of a `kermt predict --attributions` file (SMILES -> its row, which holds
    ``<task>_atoms``...: the predict report keeps its top rows whole), filed under ``source``: nothing computed."""
    found, started = Explanations(), time.perf_counter()
    _keep(found, source, list(rows), {s: {**row, SMILES_COLUMN: row[smiles_column]} for s, row in rows.items()},
          tasks)
    found.seconds = time.perf_counter() - started
    return found


def _keep(found: Explanations, model: str, smiles: Sequence[str], rows: Mapping[str, dict],
          tasks: Sequence[str]) -> None:
    """File each molecule's attributions from its row, or why there are none."""
    for text in smiles:
        per_task = _row(rows[text], tasks) if text in rows else {}
        if per_task:
            found.values[(model, text)] = per_task
        else:
            found.why_not[(model, text)] = (_why_empty(rows[text]) if text in rows else
                                            f"no attributions: {Path(model).name} has no row of the molecule")


def recorded_beside(path: Path) -> str | None:
    """``<stem>_attributions.csv`` beside a scored file, when the run wrote one (kermt eval --attributions)."""
    recorded = beside_output(path, ATTRIBUTIONS_FILE_SUFFIX)
    return str(recorded) if recorded.is_file() else None


def _computed(model: str, smiles: list[str], trust_checkpoint: bool) -> tuple[dict[str, dict], tuple[str, ...]]:
    """SMILES -> its row of ``kermt.load_run(model).predict(..., attributions=True)``, and the model's tasks."""
    from kermt.inference.trained_run import load_run  # torch and RDKit: only for a report that draws attributions

    run = load_run(model, trust_checkpoint=trust_checkpoint)
    frame = run.predict(smiles, attributions=True)
    return dict(zip(smiles, frame.to_dict("records"))), run.tasks


def _recorded(path: str, smiles: list[str], _: bool) -> tuple[dict[str, dict], tuple[str, ...]]:
    """SMILES -> its first row in a file of `kermt predict --attributions` columns (its first column is the SMILES
    the run read), read in chunks: the file may hold every molecule of a large test set."""
    import pandas as pd

    wanted, rows = set(smiles), {}
    header = pd.read_csv(path, nrows=0).columns
    tasks = tuple(c[:-len(ATOMS_SUFFIX)] for c in header if c.endswith(ATOMS_SUFFIX))
    for chunk in pd.read_csv(path, dtype={header[0]: str}, keep_default_na=False, chunksize=65_536):
        for row in chunk[chunk[header[0]].isin(wanted)].to_dict("records"):
            rows.setdefault(row[header[0]], {**row, SMILES_COLUMN: row[header[0]]})
    return rows, tasks


def _row(row: dict, tasks: Sequence[str]) -> dict[str, Explained]:
    """The row's attributions per task (empty when its cells are: invalid, or over the attributions' budget)."""
    drawn = row.get(MODEL_SMILES_COLUMN) or row[SMILES_COLUMN]
    out = {}
    for task in tasks:
        cell = row.get(task + ATOMS_SUFFIX)
        if not isinstance(cell, str) or not cell:
            continue
        descriptors = _number(row.get(task + DESCRIPTORS_SUFFIX))
        out[task] = Explained(drawn, np.asarray(json.loads(cell), dtype=np.float64),
                              float(row[task + BASELINE_SUFFIX]), 0.0 if np.isnan(descriptors) else descriptors)
    return out


def _number(cell) -> float:
    """A cell as a float (NaN when empty: a CSV read without NA conversion gives "")."""
    return float("nan") if cell is None or cell == "" else float(cell)


def _why_empty(row: dict) -> str:
    if row.get(ERROR_COLUMN):
        return f"no attributions: the model did not read the molecule ({row[ERROR_COLUMN]})"
    return "no attributions: more heavy atoms than the attributions' budget"


def colour_molecules(section: Section, task: str, explained: Sequence[Explained | str],
                     classification: bool) -> None:
    """Redraw ``section.molecules`` (in order, one entry of ``explained`` each) coloured by their attribution to
    ``task``, add a line saying how the shares add up, and set the legend; where there are none, the plain drawing
    stays and the section's notes say why."""
    values = [e for e in explained if isinstance(e, Explained)]
    for reason in dict.fromkeys(e for e in explained if isinstance(e, str)):
        section.notes.append(f"{task}: {reason}")
    if not values:
        return
    scale = max(float(np.max(np.abs(e.atoms))) if e.atoms.size else 0.0 for e in values) or 1.0
    for molecule, entry in zip(section.molecules, explained):
        if isinstance(entry, Explained):
            molecule.uri = molecule_uri(entry.smiles, atom_colours=atom_colours(entry.atoms, scale))
            molecule.lines.append(_sum_line(entry, classification))
            if entry.smiles != molecule.smiles:
                molecule.lines.append(f"drawn as the model read it: {entry.smiles}")
    section.legend = legend(task, scale, classification)


def atom_colours(atoms: np.ndarray, scale: float) -> dict[int, tuple[float, float, float]]:
    """Atom index -> its colour on the shared ``scale``; atoms under :data:`UNCOLOURED_SHARE` of it get none."""
    return {i: share_colour(v / scale) for i, v in enumerate(atoms) if abs(v) >= UNCOLOURED_SHARE * scale}


def legend(task: str, scale: float, classification: bool) -> Legend:
    what = f"the logit (log-odds) of {task}" if classification else f"the predicted {task}"
    units = "logit units" if classification else f"units of {task}"
    text = (f"Atom colours: each atom's share of {what}, red where the atom raises the prediction, blue where it "
            f"lowers it, white near 0; full colour is {scale:.3g} {units} or more, the same scale for every molecule "
            "here. The shares and the baseline (the model's value for the molecule with every atom replaced by an "
            "average drug-like atom; plus the descriptors' share, for a model with molecule descriptors) add up to "
            "the model's value: integrated gradients, docs/attributions.md.")
    return Legend(text, figures.colour_bar(scale, f"atom share of {what}"))


def _sum_line(entry: Explained, classification: bool) -> str:
    descriptors = f" + descriptors {fmt(entry.descriptors, 3)}" if entry.descriptors else ""
    value = "logit" if classification else "prediction"
    return (f"baseline {fmt(entry.baseline, 3)} + atoms {fmt(float(entry.atoms.sum()), 3)}{descriptors} ≈ "
            f"{value} {fmt(entry.total, 3)}")


def timing_note(explanations: Explanations, molecules: int, models: Sequence[str]) -> str:
    """Where the drawn molecules' attributions came from, and what they cost the report."""
    recorded = [Path(m).name for m in models if m.endswith(ATTRIBUTIONS_FILE_SUFFIX)]
    how = f"read from {', '.join(recorded)}" if len(recorded) == len(models) else "computed for this report"
    return f"atom attributions of the {molecules} drawn molecule(s) {how} in {explanations.seconds:.1f} s"


__all__ = ["Explained", "Explanations", "NO_MODEL", "UNCOLOURED_SHARE", "atom_colours",
           "colour_molecules", "explain", "legend", "read_off_rows", "recorded_beside", "timing_note"]
