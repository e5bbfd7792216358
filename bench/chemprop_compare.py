"""chemprop 2.3.1's explanations next to kermt's in bench/attributions.py (``--chemprop PYTHON``), issue 39.

Writes the task's training molecules and targets and the held-out SMILES under ``WORK/chemprop/<task>/``, runs
bench/chemprop_myerson.py with chemprop's own Python (it trains the model by ``chemprop train`` and explains the
first ``--chemprop_limit`` held-out molecules, caching both there, so a rerun resumes), and scores its JSON lines
with the same scorers as kermt's methods. Three rows per task: Myerson values, and the MCTS rationale search turned
into atom values two ways (1 in the best rationale, 0 outside; and each atom's share of the rationales found).
Molecules/s: the explained molecules over the sum of their explanations' wall seconds (model loading and training
left out); per CPU-second likewise over their CPU seconds, which a loaded shared machine changes less.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench/chemprop_myerson.py"
# (method row name, JSON-lines file, key of the atom values in each line)
VARIANTS = (("chemprop Myerson values", "myerson", "values"),
            ("chemprop MCTS, 1 in the best rationale", "mcts", "values"),
            ("chemprop MCTS, share of rationales", "mcts", "share"))


def run_chemprop(python: str, work: Path, task: str, train: Sequence[str], targets: np.ndarray,
                 test: Sequence[str], epochs: int, limit: int, seconds: float) -> Path:
    """Run bench/chemprop_myerson.py for ``task``; returns its directory of results (WORK/chemprop/<task>)."""
    base = work / "chemprop"
    base.mkdir(parents=True, exist_ok=True)
    train_csv, test_csv = base / f"{task}_train.csv", base / f"{task}_test.csv"
    pd.DataFrame({"smiles": list(train), "target": np.asarray(targets, float)}).to_csv(train_csv, index=False)
    pd.DataFrame({"smiles": list(test)}).to_csv(test_csv, index=False)
    command = [python, str(SCRIPT), "--work", str(base), "--task", task, "--train", str(train_csv),
               "--test", str(test_csv), "--epochs", str(epochs), "--limit", str(limit), "--seconds", str(seconds)]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    return base / task


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def trained_for(results: Path) -> str:
    """The epochs ``chemprop train`` ran and the one it kept (lowest validation loss), as the cache recorded them:
    so a table never passes off a shortened run as chemprop's defaults."""
    epochs = json.loads((results / "model.json").read_text())["epochs"]
    best = sorted((results / "model").glob("**/checkpoints/best-epoch=*.ckpt"))
    # Lightning counts epochs from 0; said here from 1, as "--epochs" counts them
    kept = f", kept epoch {int(best[0].name.split('=')[1].split('-')[0]) + 1}" if best else ""
    return f"{epochs} epochs{' (its default)' if epochs == 50 else ', not its default 50'}{kept}"


def chemprop_rows(task: str, results: Path, test: Sequence[str], test_targets: np.ndarray,
                  truths: Sequence[np.ndarray], score: Callable[[str, str, list, list], dict]) -> list[dict]:
    """One row per variant, scored by ``score(task, method, values, truths)`` on the held-out molecules it
    explained (the first ones, in order); the chemprop model's held-out RMSE printed beside."""
    predicted = json.loads((results / "predictions.json").read_text())["predicted"]
    rmse = float(np.sqrt(np.mean((np.asarray(predicted) - np.asarray(test_targets)) ** 2)))
    print(f"{task}: chemprop model ({trained_for(results)}): held-out RMSE {rmse:.3f}")
    rows = []
    for name, file, key in VARIANTS:
        lines = read_lines(results / f"{file}.jsonl")
        if not lines:
            continue
        assert [line["smiles"] for line in lines] == list(test[: len(lines)]), f"{file}.jsonl: other molecules"
        row = score(task, name, [np.asarray(line[key], float) for line in lines], list(truths[: len(lines)]))
        row.update(molecules=len(lines), residual=None,
                   molecules_per_s=len(lines) / sum(line["seconds"] for line in lines),
                   molecules_per_cpu_s=len(lines) / sum(line["cpu_seconds"] for line in lines))
        if "found" in lines[0]:
            row["with_rationale"] = sum(line["found"] for line in lines)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


__all__ = ["VARIANTS", "chemprop_rows", "read_lines", "run_chemprop", "trained_for"]
