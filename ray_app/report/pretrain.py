"""The report of a `kermt pretrain` save_dir, from the files the run leaves there: metrics.csv (one row per log
interval: every loss term and token accuracy of training and validation, the learning rate, molecules/s),
run.json / config.yaml / run_state.json (settings), pretrain_corpus.json and the corpus's manifest.json (molecules,
shards, vocabularies). A stopped run has no metrics.csv yet: its history is read from the newest step checkpoint
under ``ray_results/`` (the resume point), when the run kept its checkpoints there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kermt.run_layout import CHECKPOINT_STATE_FILE, METRICS_FILE, RunLayout
from ray_app.report import figures
from ray_app.report.finetune import recorded_settings, settings_section
from ray_app.report.page import NOT_RECORDED, Figure, Report, Section, Table, fmt
from ray_app.report.run_files import columns, read_json, read_rows

RUN_ROWS = ("pretrain_mode", "data_path", "continue_from", "epochs", "batch_size", "global_batch_size",
            "num_workers", "max_lr", "precision", "seed")


def is_pretrain_dir(save_dir: Path) -> bool:
    """A `kermt pretrain` save_dir: its recorded settings have a pretraining mode (a finetune's have none)."""
    record = read_json(RunLayout(save_dir).run_record) or {}
    settings = recorded_settings(save_dir, record)
    return "pretrain_mode" in settings


def pretrain_report(save_dir: Path) -> Report:
    record = read_json(RunLayout(save_dir).run_record) or {}
    settings = recorded_settings(save_dir, record)
    history, origin = run_history(save_dir)
    sections = [_run_section(save_dir, record, settings, history, origin), settings_section(record, settings),
                _corpus_section(save_dir, settings), *_curve_sections(history, origin)]
    return Report(f"kermt pretrain report: {save_dir.name}", str(save_dir), sections)


def run_history(save_dir: Path) -> tuple[dict[str, np.ndarray], str]:
    """The run's logged rows as columns, and where they were read: metrics.csv (written when the run ends), else
    the newest step checkpoint's history (a stopped run), else nothing."""
    metrics, checkpoint = RunLayout(save_dir).metrics, _newest_checkpoint(save_dir)
    rows = read_rows(metrics)
    # a resumed run that was stopped again: its checkpoint is newer than the metrics.csv of the earlier stop
    from_csv = ({k: np.asarray(v) for k, v in columns(rows).items()}, METRICS_FILE) if rows else ({}, NOT_RECORDED)
    if rows and (checkpoint is None or checkpoint.stat().st_mtime <= metrics.stat().st_mtime):
        return from_csv
    history = _checkpoint_history(checkpoint) if checkpoint else []
    if not history:
        return from_csv
    names = list(dict.fromkeys(k for row in history for k in row))
    return ({k: np.array([float(row.get(k, np.nan)) for row in history]) for k in names},
            f"{checkpoint.relative_to(save_dir)} (the newest step checkpoint: the run did not finish)")


def _newest_checkpoint(save_dir: Path) -> Path | None:
    states = list(RunLayout(save_dir).storage.glob(f"*/checkpoint_*/{CHECKPOINT_STATE_FILE}"))
    return max(states, key=lambda p: p.stat().st_mtime) if states else None


def _checkpoint_history(path: Path) -> list[dict[str, float]]:
    import torch  # only for a stopped run; mmap: the optimizer's tensors in the file are never read

    try:
        state = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        return list(state["progress"]["history"])
    except Exception:  # any: a checkpoint being written or from another version is not recorded
        return []


def _run_section(save_dir: Path, record: dict[str, Any], settings: dict[str, Any], history: dict[str, np.ndarray],
                 origin: str) -> Section:
    state = read_json(RunLayout(save_dir).run_state) or {}
    steps, epochs = history.get("step"), history.get("epoch")
    if record and origin == METRICS_FILE:
        status = "finished" if record.get("finished") else "stopped at --stop_after_steps (re-run to continue)"
    else:
        status = "not finished (interrupted, failed or still running): the report covers the steps logged"
    rows = [["run id", fmt(record.get("run_id") or state.get("run_id"))], ["status", status],
            ["last logged step", fmt(int(steps[-1]) if steps is not None and len(steps) else None)],
            ["last logged epoch", fmt(int(epochs[-1]) if epochs is not None and len(epochs) else None)],
            ["history read from", origin]]
    rows += [[name, fmt(settings.get(name))] for name in RUN_ROWS if settings.get(name) is not None]
    versions = record.get("versions") or {}
    rows += [["versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or NOT_RECORDED],
             ["git sha", fmt(record.get("git_sha"))], ["replay", fmt(record.get("replay"))]]
    return Section("Run", tables=[Table(["", "value"], rows)])


def _corpus_section(save_dir: Path, settings: dict[str, Any]) -> Section:
    corpus_record = read_json(RunLayout(save_dir).corpus_record) or {}
    corpus = corpus_record.get("corpus") or settings.get("data_path")
    section = Section("Corpus")
    if not corpus:
        section.notes.append(f"corpus {NOT_RECORDED}")
        return section
    manifest = None if "://" in str(corpus) else read_json(Path(corpus) / "manifest.json")
    if manifest is None:
        where = "in object storage" if "://" in str(corpus) else "not readable here"
        section.notes.append(f"{corpus}: its manifest.json is {where}; molecules the run saw: "
                             f"{fmt(corpus_record.get('n_molecules'))}")
        return section
    rows = [["corpus", str(corpus)], ["molecules", fmt(manifest.get("n_molecules"))],
            ["shards", fmt(len(manifest.get("shards") or []))],
            ["invalid rows dropped", fmt(manifest.get("n_invalid"))],
            ["duplicates dropped", fmt(manifest.get("n_duplicates"))],
            ["longest SMILES (tokens)", fmt(manifest.get("max_token_length"))],
            *[[f"{kind} vocabulary", fmt(manifest.get(f"{kind}_vocab_size"))] for kind in ("atom", "bond", "smiles")],
            ["functional-group labels", fmt(manifest.get("fg_size"))], ["made by", fmt(manifest.get("created_by"))]]
    inputs = [[fmt(i.get("path")), fmt(i.get("rows")), fmt(i.get("invalid")), fmt(i.get("duplicates"))]
              for i in manifest.get("inputs") or []]
    section.tables.append(Table(["", "value"], rows))
    if inputs:
        section.tables.append(Table(["input", "rows", "invalid", "duplicates"], inputs, caption="inputs"))
    return section


def _terms(history: dict[str, np.ndarray]) -> list[str]:
    """The logged terms (``loss``, ``av``, ``recon_accuracy``, ...), in first-seen order over train and val."""
    names = [k.split("_", 1)[1] for k in history if k.startswith(("train_", "val_"))]
    return sorted(dict.fromkeys(names), key=lambda name: name != "loss")  # the total first


def _term_panel(history: dict[str, np.ndarray], term: str) -> tuple[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    step = history["step"]
    lines = {split: (step, history[f"{split}_{term}"]) for split in ("train", "val") if f"{split}_{term}" in history}
    return term, lines


def _curve_sections(history: dict[str, np.ndarray], origin: str) -> list[Section]:
    if "step" not in history or not len(history["step"]):
        return [Section("Training", notes=[f"metrics.csv {NOT_RECORDED} (no interval was logged before the run "
                                           "stopped); re-run the same command to resume, then `kermt report`"])]
    terms = _terms(history)
    losses = [_term_panel(history, t) for t in terms if not t.endswith("accuracy")]
    accuracies = [_term_panel(history, t) for t in terms if t.endswith("accuracy")]
    training = Section("Training", notes=[f"{len(history['step'])} logged row(s) from {origin}; validation "
                                          "(dashed) is logged at fewer steps than training"])
    training.figures.append(Figure("every loss term against the step (train solid, validation dashed)",
                                   figures.line_panels(losses)))
    if accuracies:
        training.figures.append(Figure("token accuracies against the step",
                                       figures.line_panels(accuracies)))
    schedule = _schedule_figure(history)
    if schedule is None:
        training.notes.append(f"learning rate and throughput {NOT_RECORDED}")
    else:
        training.figures.append(schedule)
    training.tables.append(_last_values(history, terms))
    return [training]


def _schedule_figure(history: dict[str, np.ndarray]) -> Figure | None:
    step = history["step"]
    panels = [("learning rate", {"lr": (step, history["lr"])})] if "lr" in history else []
    if "molecules_per_s" in history:
        panels.append(("throughput (molecules/s)", {"train": (step, history["molecules_per_s"])}))
    if not panels:
        return None
    return Figure("learning rate and training throughput (molecules/s over each log interval)",
                  figures.line_panels(panels))


def _last_values(history: dict[str, np.ndarray], terms: list[str]) -> Table:
    """Each term's first and last logged value, train and validation; throughput's median."""
    def ends(name: str) -> list[str]:
        values = history.get(name)
        finite = values[np.isfinite(values)] if values is not None else np.array([])
        return [fmt(float(finite[0])), fmt(float(finite[-1]))] if len(finite) else [NOT_RECORDED] * 2

    rows = [[term, *ends(f"train_{term}"), *ends(f"val_{term}")] for term in terms]
    speed = history.get("molecules_per_s")
    if speed is not None and np.isfinite(speed).any():
        rows.append(["molecules/s (median)", fmt(float(np.nanmedian(speed))), "", "", ""])
    return Table(["term", "train first", "train last", "val first", "val last"], rows,
                 caption="first and last logged values")


__all__ = ["is_pretrain_dir", "pretrain_report", "run_history"]
