"""The scorer an ``--objective`` names: ``lookup:`` and ``python:`` in this process (kermt.explore.scorers),
``command:`` as Ray tasks across the cluster, each with the CPUs it asks for (``--objective_cpus``).

A command task scores ``--objective_batch_size`` molecules: it writes them to ``input.smi`` (one SMILES a line),
runs ``PROGRAM input.smi output.csv`` with a time limit of ``--objective_timeout`` seconds per molecule, and reads
``output.csv`` (a header, then ``smiles,score`` rows). What goes wrong is recorded per molecule, never fatal: a
program that fails or runs out of time gives each of its molecules that reason, a molecule missing from the output
(or scored with no number) its own. The round's tasks run in parallel, as many at once as the cluster's CPUs hold.
"""

from __future__ import annotations

import csv
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from kermt.errors import UserError
from kermt.explore.objective_spec import ObjectiveSpec
from kermt.explore.scorers import Scores, lookup_scorer, python_scorer

Scorer = Callable[[Sequence[str]], Scores]


def make_scorer(spec: ObjectiveSpec, timeout_s: float, cpus: float, batch_size: int,
                address: str | None = None) -> Scorer:
    """The scorer of ``spec``, checked now (a lookup file's header, a python function's import, a command's
    program): a one-line error before any work."""
    if spec.kind == "lookup":
        return lookup_scorer(spec)
    if spec.kind == "python":
        return python_scorer(spec)
    program = spec.program[0]
    if "/" in program and not Path(program).is_file():
        raise UserError(f"--objective {spec.text}: {program} does not exist")
    return lambda smiles: score_with_command(spec.program, smiles, timeout_s, cpus, batch_size, address)


def score_with_command(program: Sequence[str], smiles: Sequence[str], timeout_s: float, cpus: float,
                       batch_size: int, address: str | None = None) -> Scores:
    """``smiles`` scored by ``program``, ``batch_size`` molecules per Ray task, all tasks submitted at once (on the
    cluster at ``address``, else the one this process is connected to, else a local one)."""
    import ray

    from ray_app.common.cluster import connect

    connect(address)

    task = ray.remote(num_cpus=cpus, max_retries=0)(_score_chunk)
    chunks = [list(smiles[i:i + batch_size]) for i in range(0, len(smiles), batch_size)]
    results = ray.get([task.remote(list(program), chunk, timeout_s * len(chunk)) for chunk in chunks])
    values = np.concatenate([np.asarray(v, dtype=np.float64) for v, _ in results]) if results else np.zeros(0)
    return Scores(values, [e for _, errors in results for e in errors])


def _score_chunk(program: list[str], smiles: list[str], timeout_s: float) -> tuple[list[float], list[str]]:
    """One task: ``program`` on ``smiles`` in a scratch folder; (scores, errors), one each."""
    name = Path(program[0]).name  # how the errors name it
    with tempfile.TemporaryDirectory(prefix="kermt-explore-") as scratch:
        given, wanted = Path(scratch) / "input.smi", Path(scratch) / "output.csv"
        given.write_text("".join(f"{s}\n" for s in smiles))
        try:
            done = subprocess.run([*program, str(given), str(wanted)], capture_output=True, text=True,
                                  timeout=timeout_s, cwd=scratch)
        except subprocess.TimeoutExpired:
            return [float("nan")] * len(smiles), [f"timed out after {timeout_s:g} s"] * len(smiles)
        except OSError as error:
            return [float("nan")] * len(smiles), [f"cannot run {name}: {error.strerror or error}"] * len(smiles)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [""])[-1][:200]
            why = f"{name} exited with status {done.returncode}" + (f": {last}" if last else "")
            return [float("nan")] * len(smiles), [why] * len(smiles)
        return _read_output(wanted, smiles, name)


def _read_output(path: Path, smiles: list[str], program: str) -> tuple[list[float], list[str]]:
    found: dict[str, str] = {}
    if path.is_file():
        with path.open(newline="") as f:
            for row in list(csv.reader(f))[1:]:
                if len(row) >= 2:
                    found.setdefault(row[0], row[1])
    scores, errors = [], []
    for s in smiles:
        try:
            value = float(found[s])
        except (KeyError, ValueError):
            value = float("nan")
        scores.append(value)
        errors.append("" if np.isfinite(value) else f"{program} wrote no score for it" if s not in found
                      else f"{program} wrote {found[s]!r}, not a number")
    return scores, errors


__all__ = ["Scorer", "make_scorer", "score_with_command"]
