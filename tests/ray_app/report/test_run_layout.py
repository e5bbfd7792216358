"""kermt.run_layout names every file a real finetune writes: each name the layout gives for the run and its fold
exists in the tiny calibrated run's save_dir, and nothing in it is unnamed (a writer that spells a new file
without adding it to the layout fails here)."""

from __future__ import annotations

from kermt.run_layout import (CHECKPOINT_STATE_FILE, DOMAIN_ARRAYS_FILE, EARLIER_RUNS_DIR, RunLayout,
                              member_directories)


def test_the_layout_names_what_a_finetune_writes(regression_run):
    save_dir, _ = regression_run
    layout = RunLayout(save_dir)
    run_files = [layout.run_state, layout.config, layout.splits, layout.invalid_smiles, layout.run_record,
                 layout.storage]
    assert [p.name for p in run_files if not p.exists()] == []
    assert [k for k, _ in layout.folds()] == [0]
    assert {p.name for p in save_dir.iterdir()} - {p.name for p in run_files} - {
        layout.fold(0).name, layout.report.name, EARLIER_RUNS_DIR} == set()
    fold_files = [layout.test_result(0), layout.test_spread(0), layout.calibration(0), layout.domain(0)]
    assert [p.name for p in fold_files if not p.exists()] == []
    members = member_directories(layout.fold(0))
    assert members == [(0, layout.member(0, 0)), (1, layout.member(0, 1))]
    assert {p.name for p in layout.fold(0).iterdir()} == {p.name for p in fold_files} | {
        DOMAIN_ARRAYS_FILE} | {d.name for _, d in members}
    for _, directory in members:
        member = RunLayout(directory)
        assert member.model.is_dir() and member.upstream_model.is_file() and member.metrics.is_file()
        assert {p.name for p in directory.iterdir()} <= {member.model.name, member.upstream_model.name,
                                                           member.metrics.name, CHECKPOINT_STATE_FILE}
