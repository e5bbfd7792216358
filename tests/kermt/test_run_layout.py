"""The run layout spells the on-disk contract (the literal names below are what runs on disk have and what older
readers look for) and costs no import; the layout of a real finetune's save_dir is checked in
tests/ray_app/report/test_run_layout.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kermt.run_layout import RunLayout, fold_directory, numbered


def test_the_layout_names_the_files_runs_have_on_disk():
    root = Path("/runs/r")
    layout = RunLayout(root)
    assert layout.member(2, 1) == root / "fold_2" / "model_1"
    assert [layout.test_result(0).name, layout.test_spread(0).name, layout.calibration(0).name,
            layout.class_calibration(0).name, layout.domain(0).name] == [
        "test_result.csv", "test_spread.csv", "calibration.json", "classification_calibration.json", "domain.json"]
    assert [p.name for p in (layout.run_state, layout.config, layout.run_record, layout.splits,
                             layout.invalid_smiles, layout.report, layout.storage, layout.earlier_runs)] == [
        "run_state.json", "config.yaml", "run.json", "splits.json", "invalid_smiles.csv", "report.html",
        "ray_results", "earlier_runs"]
    member = RunLayout(layout.member(0, 0))  # a member's directory names its own files as a run does
    assert (member.model.name, member.upstream_model.name, member.metrics.name) == ("model", "model.pt", "metrics.csv")
    assert layout.trial("t1") == root / "trials" / "t1"
    assert [p.name for p in (layout.sweep, layout.all_trials, layout.sweep_record, layout.best_config,
                             layout.best_model)] == [
        "tune_config.yaml", "all_trials.csv", "sweep.json", "best_config.yaml", "best_model"]


def test_folds_are_in_numeric_order_and_only_numbered_directories_count(tmp_path):
    for name in ("fold_10", "fold_2", "fold_x", "fold_3.tmp"):
        (tmp_path / name).mkdir()
    (tmp_path / "fold_4").write_text("a file, not a fold")
    assert RunLayout(tmp_path).folds() == [(2, tmp_path / "fold_2"), (10, tmp_path / "fold_10")]
    assert numbered(tmp_path / "missing", "fold") == []


def test_the_domain_of_a_first_member_is_its_folds_else_the_roots(tmp_path):
    layout = RunLayout(tmp_path)
    first = layout.member(0, 0) / "model"
    first.mkdir(parents=True)
    assert fold_directory(tmp_path, first) is None
    layout.domain(0).write_text("{}")
    assert fold_directory(tmp_path, first) == layout.fold(0)
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "domain.json").write_text("{}")
    assert fold_directory(tmp_path / "loose", tmp_path / "loose" / "m.pt") == tmp_path / "loose"


def test_importing_the_layout_costs_no_heavy_module():
    code = ("import sys, kermt.run_layout\n"
            "heavy = sorted(m for m in ('torch', 'numpy', 'ray', 'yaml', 'pydantic') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)
