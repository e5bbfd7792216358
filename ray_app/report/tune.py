"""The report of a `kermt tune` save_dir, from the files the sweep leaves: sweep.json (best trial, objective, trial
counts), tune_config.yaml, all_trials.csv (one row per trial, in creation order: status, objective, test score,
every sampled setting) and trials/<id>/metrics.csv (each finished trial's epochs)."""

from __future__ import annotations

import math
from pathlib import Path

from kermt.run_layout import ALL_TRIALS_FILE, SWEEP_FILE, RunLayout
from ray_app.report import figures
from ray_app.report.page import NOT_RECORDED, Figure, Report, Section, Table, fmt
from ray_app.report.run_files import columns, read_json, read_rows, read_yaml

FIXED_COLUMNS = ("trial_id", "status", "test_", "best_epoch", "epochs_run", "error")
SWEEP_SETTINGS = ("n_trials", "search", "scheduler", "search_space", "hpo_mode", "max_concurrent_trials",
                  "num_workers_per_trial", "epochs", "metric", "data_path", "checkpoint_path", "split_type", "seed")


def _number(cell: str | None) -> float:
    try:
        return float(cell) if cell not in (None, "") else math.nan
    except ValueError:
        return math.nan


def objective_column(rows: list[dict[str, str]]) -> str | None:
    return next((c for c in rows[0] if c.startswith("objective")), None) if rows else None


def varying_settings(rows: list[dict[str, str]]) -> list[str]:
    """The sampled settings: the columns that are not the fixed ones and differ between trials."""
    objective = objective_column(rows)
    names = [c for c in rows[0] if c != objective and not c.startswith(FIXED_COLUMNS)] if rows else []
    return [n for n in names if len({r[n] for r in rows}) > 1]


def tune_report(save_dir: Path) -> Report:
    rows = read_rows(RunLayout(save_dir).all_trials) or []
    sweep = read_json(RunLayout(save_dir).sweep_record) or {}
    objective = objective_column(rows)
    sections = [_sweep_section(save_dir, sweep, rows)]
    if objective is None:
        sections[0].notes.append(f"{ALL_TRIALS_FILE} {NOT_RECORDED} (the sweep has not finished)")
        return Report(f"kermt tune report: {save_dir.name}", str(save_dir), sections)
    values = [_number(r[objective]) for r in rows]
    mode = str(sweep.get("mode") or ("max" if ", max)" in objective else "min"))
    progress = figures.trial_objectives(values, [r["status"] for r in rows], objective, mode)
    search = Section("Objective", figures=[
        Figure(f"{objective} of each trial in the order they started, and the best so far", progress)])
    for name in varying_settings(rows):
        search.figures.append(Figure(f"{objective} against {name}", figures.against_setting(
            [r[name] for r in rows], values, name, objective)))
    sections += [search, _curves_section(save_dir, rows, sweep.get("best_trial")), _trials_section(rows, objective)]
    return Report(f"kermt tune report: {save_dir.name}", str(save_dir), sections)


def _sweep_section(save_dir: Path, sweep: dict, rows: list[dict[str, str]]) -> Section:
    config = read_yaml(RunLayout(save_dir).sweep) or {}
    table = [["best trial", fmt(sweep.get("best_trial"))], ["objective", f"{fmt(sweep.get('objective'))} "
                                                           f"({fmt(sweep.get('mode'))})"],
             ["best objective", fmt(sweep.get("best_objective"))],
             *[[k, fmt(v)] for k, v in sweep.items() if k.startswith("best_test_")],
             ["trials", ", ".join(f"{n} {s}" for s, n in (sweep.get("trials") or {}).items()) or
              f"{len(rows)} in {ALL_TRIALS_FILE}"], ["wall time (s)", fmt(sweep.get("wall_s"))]]
    table += [[f"best {k}", fmt(v)] for k, v in (sweep.get("best_settings") or {}).items()]
    table += [[f"sweep {k}", fmt(config[k])] for k in SWEEP_SETTINGS if config.get(k) is not None]
    return Section("Sweep", notes=[f"{SWEEP_FILE} lists every setting of the sweep"] if config else [],
                   tables=[Table(["", "value"], table)])


def _curves_section(save_dir: Path, rows: list[dict[str, str]], best: str | None) -> Section:
    section = Section("Learning curves")
    histories = {}
    for row in rows:
        history = columns(read_rows(RunLayout(RunLayout(save_dir).trial(row["trial_id"])).metrics) or [])
        if "epoch" in history:
            histories[row["trial_id"]] = history
    if best in histories:
        metric = next((c[4:] for c in histories[best] if c.startswith("val_") and c != "val_loss"), "metric")
        section.figures.append(Figure(f"best trial {best}: loss, validation {metric} and learning rate per epoch",
                                      figures.learning_curves({best: histories[best]}, metric)))
        section.figures.append(Figure(f"validation {metric} per epoch of every trial with saved files",
                                      figures.learning_curves({k: {"epoch": h["epoch"], f"val_{metric}":
                                                                   h.get(f"val_{metric}", [])}
                                                               for k, h in histories.items()}, metric)))
    else:
        section.notes.append(f"the best trial's metrics.csv is {NOT_RECORDED} (trials/<id>/ holds finished trials)")
    return section


def _trials_section(rows: list[dict[str, str]], objective: str) -> Section:
    shown = ["trial_id", "status", objective, *(c for c in rows[0] if c.startswith("test_")), "best_epoch",
             "epochs_run", *varying_settings(rows), "error"]
    cells = [[fmt(r.get(c) if c == "trial_id" else _short(r.get(c))) for c in shown] for r in rows]
    return Section("Trials", tables=[Table(shown, cells)])


def _short(cell: str | None) -> str | None:
    value = _number(cell)
    return cell if cell in (None, "") or math.isnan(value) else f"{value:.4g}"


__all__ = ["tune_report"]
