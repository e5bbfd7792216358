"""The report of a `kermt finetune` save_dir, built only from the files the run leaves there (run.json,
config.yaml/run_state.json, invalid_smiles.csv, splits.json, fold_k/model_m/metrics.csv, fold_k/test_result.csv,
fold_k/calibration.json, fold_k/test_spread.csv). Whatever is missing (an interrupted run, a run made before a
file existed) is said so on the page."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from kermt.chem.validation import reason_kind
from kermt.data.splits import split_description
from kermt.errors import UserError
from kermt.metrics import task_scores
from kermt.run_layout import (CALIBRATION_FILE, INVALID_SMILES_FILE, METRICS_FILE, TEST_SPREAD_FILE, RunLayout,
                              fold_name, member_directories)
from kermt.uncertainty import intervals, load_calibrations
from ray_app.common.release import RELEASE_REPO
from ray_app.report import figures
from ray_app.report.page import NOT_RECORDED, Figure, Report, Section, Table, fmt
from ray_app.report.results import TestResult, read_spread, read_test_result
from ray_app.report.run_files import columns, read_json, read_rows, read_yaml
from ray_app.report.tasks import TaskData, explain_worst, labelled, task_section

LEVEL = 0.9
SPLITS = ("train", "val", "test")


def finetune_report(save_dir: Path) -> Report:
    layout = RunLayout(save_dir)
    record = read_json(layout.run_record) or {}
    settings = recorded_settings(save_dir, record)
    summary = record.get("summary", {})
    dataset_type = summary.get("dataset_type") or settings.get("dataset_type") or "regression"
    metric = summary.get("metric") or settings.get("metric") or "rmse"
    folds = layout.folds()
    results = {k: read_test_result(layout.test_result(k)) for k, _ in folds if layout.test_result(k).exists()}
    sections = [_run_section(save_dir, record, settings, summary), settings_section(record, settings),
                _data_section(save_dir, record, results, dataset_type),
                _learning_section(folds, metric), _metrics_section(record, results, metric, dataset_type)]
    sections += _task_sections(folds, results, dataset_type, sections[0])
    return Report(title=f"kermt finetune report: {save_dir.name}", source=str(save_dir), sections=sections)


def recorded_settings(save_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Each setting's value: run.json's (the finished run), else config.yaml's, else run_state.json's."""
    if isinstance(record.get("settings"), dict):
        return {k: v.get("value") if isinstance(v, dict) else v for k, v in record["settings"].items()}
    layout = RunLayout(save_dir)
    return read_yaml(layout.config) or (read_json(layout.run_state) or {}).get("settings") or {}


def _run_section(save_dir: Path, record: dict[str, Any], settings: dict[str, Any], summary: dict) -> Section:
    state = read_json(RunLayout(save_dir).run_state) or {}
    finished = bool(record)
    overall = {k: v for k, v in summary.items() if k.startswith("overall_")}
    versions = record.get("versions") or {}
    rows = [["run id", fmt(summary.get("run_id") or state.get("run_id"))],
            ["status", "finished (run.json written)" if finished else
             "not finished (interrupted, failed or still running): the report covers the members that finished"],
            ["data", fmt(settings.get("data_path"))], ["checkpoint", _starting_point(settings)],
            ["dataset type", fmt(summary.get("dataset_type") or settings.get("dataset_type"))],
            ["metric", fmt(summary.get("metric") or settings.get("metric"))], ["split", _split(record, settings)]]
    # upstream's summary keys name split_type whatever the separate files: the split row says what it was
    rows += [[name, f"{fmt(value)} (std {fmt(summary.get('std'))})"] for name, value in overall.items()]
    rows += [["versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or NOT_RECORDED],
             ["git sha", fmt(record.get("git_sha"))], ["replay", fmt(record.get("replay"))]]
    return Section("Run", tables=[Table(["", "value"], rows)])


def _starting_point(settings: dict[str, Any]) -> str:
    """What the members started from: the checkpoint given, the release, or nothing (from scratch). A run whose
    settings are not known at all says so."""
    if settings.get("checkpoint_path"):
        return str(settings["checkpoint_path"])
    if settings.get("pretrained_release"):
        return f"the release, {RELEASE_REPO} (--pretrained_release)"
    if not settings:
        return NOT_RECORDED
    return "none: trained from scratch"


def _split(record: dict[str, Any], settings: dict[str, Any]) -> str:
    """run.json's split in words; for a run that has not written it, the same words from its settings."""
    if record.get("split"):
        return str(record["split"])
    if not settings.get("split_type"):
        return NOT_RECORDED
    return split_description(settings["split_type"], settings.get("separate_val_path"),
                             settings.get("separate_test_path"))


def settings_section(record: dict[str, Any], settings: dict[str, Any]) -> Section:
    recorded = record.get("settings")
    if isinstance(recorded, dict):
        given = {k: v for k, v in recorded.items() if isinstance(v, dict) and v.get("source", "default") != "default"}
        notes = [f"{len(recorded) - len(given)} other setting(s) at their defaults (run.json lists every one)"]
        return Section("Settings", notes=notes, tables=[Table(["setting", "value", "source"], [
            [k, fmt(v.get("value")), fmt(v.get("source"))] for k, v in given.items()])])
    if not settings:
        return Section("Settings", notes=[f"settings {NOT_RECORDED} (no run.json, config.yaml or run_state.json)"])
    return Section("Settings", notes=["from config.yaml (the run has not written run.json)"],
                   tables=[Table(["setting", "value"], [[k, fmt(v)] for k, v in settings.items() if v is not None])])


def _data_section(save_dir: Path, record: dict[str, Any], results: dict[int, TestResult], dataset_type: str) \
        -> Section:
    section = Section("Data")
    invalid = read_rows(RunLayout(save_dir).invalid_smiles)
    splits = read_json(RunLayout(save_dir).splits) or {}
    folds_record = record.get("folds") or {}
    sizes = {name: _split_sizes(name, splits.get(name), folds_record.get(name), results) for name in
             sorted(set(splits) | set(folds_record) | {fold_name(k) for k in results}, key=_fold_number)}
    first = next(iter(sizes.values()), {})
    if all(isinstance(first.get(s), int) for s in SPLITS):
        total = sum(first[s] for s in SPLITS) + (len(invalid) if invalid is not None else 0)
        section.notes.append(f"{total} molecule(s) in the data" + (" (the training file and the separate files)"
                                                                  if "separate" in str(splits) else ""))
    if invalid is None:
        section.notes.append(f"invalid rows: {NOT_RECORDED}")
    else:
        reasons = Counter(reason_kind(row.get("reason", "?")) for row in invalid)  # RDKit's detail is in the file
        section.notes.append(f"{len(invalid)} invalid row(s) skipped" + (": " + ", ".join(
            f"{n} {reason}" for reason, n in reasons.items()) + f" ({INVALID_SMILES_FILE})" if invalid else ""))
    section.tables.append(Table(["fold", *SPLITS], [[name, *(fmt(s.get(p)) for p in SPLITS)]
                                                     for name, s in sizes.items()], caption="split sizes"))
    section.tables.append(_label_table(folds_record, results, dataset_type))
    return section


def _fold_number(name: str) -> int:
    return int(name.split("_")[-1]) if name.split("_")[-1].isdigit() else 0


def _split_sizes(name: str, rows: Any, fold: dict | None, results: dict[int, TestResult]) -> dict[str, Any]:
    if fold and isinstance(fold.get("sizes"), dict):
        return fold["sizes"]
    sizes = {s: len(v) if isinstance(v, list) else None for s, v in (rows or {}).items()}
    result = results.get(_fold_number(name))
    if sizes.get("test") is None and result is not None:
        sizes["test"] = len(result.smiles)
    return sizes


def _label_table(folds_record: dict, results: dict[int, TestResult], dataset_type: str) -> Table:
    """Labelled molecules per task and split (positives too, for classification); the test column falls back to
    test_result.csv for runs that did not record the counts."""
    rows = []
    for k, result in sorted(results.items()):
        counts = (folds_record.get(fold_name(k)) or {}).get("labels", {})
        for t, task in enumerate(result.tasks):
            measured = result.targets[:, t] if result.targets is not None else np.array([])
            test = int(np.sum(~np.isnan(measured)))
            task_counts = counts.get(task, {})
            row = [fold_name(k), task, *(fmt(task_counts.get(s)) for s in SPLITS[:2]), str(test)]
            if dataset_type == "classification":
                row.append(str(int(np.nansum(measured))))
            rows.append(row)
    columns_ = ["fold", "task", "train labels", "val labels", "test labels"]
    columns_ += ["test positives"] if dataset_type == "classification" else []
    return Table(columns_, rows, caption="labelled molecules per task")


def _learning_section(folds: list[tuple[int, Path]], metric: str) -> Section:
    section = Section("Learning curves")
    best_rows = []
    for k, fold_dir in folds:
        histories = {}
        for m, member_dir in member_directories(fold_dir):
            history = columns(read_rows(RunLayout(member_dir).metrics) or [])
            if "epoch" not in history:
                section.notes.append(f"fold {k} model {m}: no {METRICS_FILE} (not finished)")
                continue
            histories[f"model {m}"] = history
            recorded_best = history.get("best_epoch", [float("nan")])[-1]
            best = int(recorded_best) if np.isfinite(recorded_best) else None
            val = history.get(f"val_{metric}", [])
            best_rows.append([f"fold {k}", f"model {m}", str(len(history["epoch"])), fmt(best),
                              fmt(val[best] if best is not None and best < len(val) else None)])
        if histories:
            section.figures.append(Figure(f"fold {k}: loss, validation {metric} and learning rate per epoch",
                                          figures.learning_curves(histories, metric)))
    if not best_rows:
        section.notes.append(f"no finished member: learning curves {NOT_RECORDED}")
    else:
        section.tables.append(Table(["fold", "member", "epochs", "best epoch", f"val {metric} at best"], best_rows))
    return section


def _metrics_section(record: dict[str, Any], results: dict[int, TestResult], metric: str, dataset_type: str) \
        -> Section:
    section = Section(f"Test {metric} of each member and of the ensemble")
    folds_record = record.get("folds") or {}
    rows = []
    for k, result in sorted(results.items()):
        scores = (folds_record.get(fold_name(k)) or {}).get("member_test_scores")
        for m, member in enumerate(scores or []):
            rows.append([f"fold {k}", f"model {m}", *(fmt(member.get(t)) for t in result.tasks)])
        if scores is None:
            rows.append([f"fold {k}", "each member", *([NOT_RECORDED] * len(result.tasks))])
        if result.targets is not None:
            ensemble = task_scores(result.preds, result.targets, metric, dataset_type)
            rows.append([f"fold {k}", "ensemble (mean)", *(fmt(v) for v in ensemble)])
    if not rows:
        section.notes.append(f"no test_result.csv: test metrics {NOT_RECORDED} (the run did not finish)")
        return section
    tasks = next(iter(results.values())).tasks
    section.tables.append(Table(["fold", "model", *tasks], rows))
    return section


def _task_sections(folds: list[tuple[int, Path]], results: dict[int, TestResult], dataset_type: str,
                   run: Section) -> list[Section]:
    """One section per task over every fold's test set (the folds' test sets are disjoint)."""
    if not results:
        return []
    tasks = next(iter(results.values())).tasks
    notes: list[str] = []
    per_task = [_pooled(task, t, folds, results, dataset_type, notes) for t, task in enumerate(tasks)]
    explained = explain_worst(per_task, notes)  # each test molecule by its own fold's members
    sections = [task_section(task, dataset_type, "the test set" + (f" of {len(results)} folds"
                                                                    if len(results) > 1 else ""), why)
                for task, why in zip(per_task, explained)]
    run.notes += sorted(set(notes))
    return sections


def _pooled(task: str, t: int, folds: list[tuple[int, Path]], results: dict[int, TestResult], dataset_type: str,
            notes: list[str]) -> TaskData:
    parts, with_interval = [], True
    for k, fold_dir in folds:
        result = results.get(k)
        if result is None or result.targets is None:
            continue
        bounds = _interval(fold_dir, result, task, t, notes) if dataset_type == "regression" else None
        with_interval = with_interval and bounds is not None
        parts.append(labelled(task, result.smiles, result.targets[:, t], result.preds[:, t],
                              *(bounds if bounds is not None else (None, None)), model=str(fold_dir)))
    if not parts:
        return TaskData(task, [], np.array([]), np.array([]))

    def join(name: str) -> np.ndarray:
        return np.concatenate([getattr(p, name) for p in parts])

    return TaskData(task, [s for p in parts for s in p.smiles], join("measured"), join("predicted"),
                    join("lower") if with_interval else None, join("upper") if with_interval else None,
                    [m for p in parts for m in p.models])


def _interval(fold_dir: Path, result: TestResult, task: str, t: int, notes: list[str]):
    path = fold_dir / CALIBRATION_FILE
    if not path.exists():
        return None
    try:
        calibration = load_calibrations(str(path)).get(task)
        if calibration is None:
            return None
        spread, distance = read_spread(fold_dir / TEST_SPREAD_FILE, result.tasks)
        if calibration.method != "plain" and spread is None:
            notes.append(f"intervals not drawn: the members' spread on the test set is {NOT_RECORDED} "
                         f"({fold_dir.name}/{TEST_SPREAD_FILE}; runs made before the report do not have it)")
            return None
        return intervals(calibration, result.preds[:, t], None if spread is None else spread[:, t], LEVEL, distance)
    except UserError as error:
        notes.append(f"intervals not drawn for {task}: {error}")
        return None


__all__ = ["finetune_report", "recorded_settings", "settings_section"]
