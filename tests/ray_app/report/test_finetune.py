"""The finetune report from a real tiny run's save_dir: what the run records for it, what the page shows, and the
runs it must not crash on (interrupted, made before the report, a task without test labels)."""

from __future__ import annotations

import csv
import json
import re
import shutil

import numpy as np
import pytest

from kermt.uncertainty import intervals, load_calibrations
from ray_app.report import write_report
from ray_app.report.finetune import finetune_report
from ray_app.report.results import read_test_result
from tests.ray_app.finetune.tiny_runs import TASKS, demo_rows, tiny_finetune

FIGURES_PER_TASK = 2  # regression: parity, residuals; classification: ROC + PR, confusion
KEY = 1  # the colour key of the worst molecules' attribution colours
WORST = 8


def _titles(report) -> list[str]:
    return [s.title for s in report.sections]


def _copy(save_dir, tmp_path):
    return shutil.copytree(save_dir, tmp_path / "run", ignore=shutil.ignore_patterns("ray_results", "model.pt"))


def test_run_records_sizes_labels_member_scores_and_spread(regression_run):
    save_dir, out = regression_run
    record = json.loads((save_dir / "run.json").read_text())["folds"]["fold_0"]
    splits = json.loads((save_dir / "splits.json").read_text())["fold_0"]
    assert record["sizes"] == {name: len(splits[name]) for name in ("train", "val", "test")}
    assert sum(record["sizes"].values()) == 120  # the invalid row is not in any split
    result = read_test_result(save_dir / "fold_0" / "test_result.csv")
    assert [record["labels"][t]["test"] for t in TASKS] == [int((~np.isnan(result.targets[:, i])).sum())
                                                           for i in range(2)]
    assert len(record["member_test_scores"]) == 2
    assert all(np.isfinite(m[t]) and m[t] > 0 for m in record["member_test_scores"] for t in TASKS)
    spread = read_test_result(save_dir / "fold_0" / "test_spread.csv")
    assert spread.targets is None and spread.smiles == result.smiles and (spread.preds >= 0).all()
    assert (spread.preds > 0).any()  # two members disagree somewhere
    assert f"report: {save_dir / 'report.html'}" in out.splitlines()


def test_report_shows_every_part_of_a_finished_regression_run(regression_run):
    save_dir, _ = regression_run
    report = finetune_report(save_dir)
    assert _titles(report) == ["Run", "Settings", "Data", "Learning curves",
                               "Test rmse of each member and of the ensemble", "Task logp", "Task tpsa_100"]
    assert report.image_count() == 1 + 2 * (FIGURES_PER_TASK + KEY + WORST)
    data = report.sections[2]
    assert "1 invalid row(s) skipped: 1 unparsable (invalid_smiles.csv)" in data.notes
    assert "121 molecule(s) in the data" in data.notes
    metrics = report.sections[4].tables[0]
    assert [row[1] for row in metrics.rows] == ["model 0", "model 1", "ensemble (mean)"]
    task = report.sections[5]
    assert any(n.startswith("90% interval from the fold calibration") for n in task.notes)
    assert len(task.molecules) == WORST
    assert all(m.uri and m.uri.startswith("data:image/svg+xml") for m in task.molecules)


def _run_row(report, name: str) -> str:
    return next(row[1] for row in report.sections[0].tables[0].rows if row[0] == name)


def test_run_table_says_what_the_members_started_from(regression_run, tmp_path):
    save_dir, _ = regression_run
    given = json.loads((save_dir / "run.json").read_text())["settings"]["checkpoint_path"]["value"]
    assert given.endswith("ckpt_pretrain_vocab.pt") and _run_row(finetune_report(save_dir), "checkpoint") == given
    # what run.json records for a run given no checkpoint: checkpoint_path null, no --pretrained_release
    run = _copy(save_dir, tmp_path)
    record = json.loads((run / "run.json").read_text())
    record["settings"]["checkpoint_path"]["value"] = None
    (run / "run.json").write_text(json.dumps(record))
    assert _run_row(finetune_report(run), "checkpoint") == "none: trained from scratch"


def test_worst_molecules_carry_their_errors_and_the_calibrated_interval(regression_run):
    save_dir, _ = regression_run
    result = read_test_result(save_dir / "fold_0" / "test_result.csv")
    spread = read_test_result(save_dir / "fold_0" / "test_spread.csv").preds
    lower, upper = intervals(load_calibrations(str(save_dir / "fold_0" / "calibration.json"))["logp"],
                             result.preds[:, 0], spread[:, 0], 0.9)
    labelled = ~np.isnan(result.targets[:, 0])
    errors = np.abs(result.preds[labelled, 0] - result.targets[labelled, 0])
    section = finetune_report(save_dir).sections[5]
    worst = section.molecules[0]
    i = result.smiles.index(worst.smiles)
    assert abs(float(worst.lines[2].split()[-1])) == np.float64(f"{errors.max():.4g}")
    assert worst.lines[3] == f"90% interval [{lower[i]:.4g}, {upper[i]:.4g}]"
    # coloured by the fold's own members: the attributions add up to the fold's prediction of each molecule
    assert section.legend.text.startswith("Atom colours: each atom's share of the predicted logp")
    for molecule in section.molecules:
        baseline, *_, total = (float(x) for x in re.findall(r"-?\d+\.?\d*(?:e[+-]?\d+)?", molecule.lines[4]))
        predicted = result.preds[result.smiles.index(molecule.smiles), 0]
        assert abs(total - predicted) <= 0.01 + 0.2 * abs(predicted - baseline), molecule.lines


def test_interrupted_run_report_covers_the_members_that_finished(regression_run, tmp_path):
    run = _copy(regression_run[0], tmp_path)
    for name in ("run.json", "fold_0/test_result.csv", "fold_0/test_spread.csv", "fold_0/calibration.json",
                 "fold_0/model_1/metrics.csv"):
        (run / name).unlink()
    report = finetune_report(run)
    assert report.image_count() == 1  # the learning curves of model 0
    assert "fold 0 model 1: no metrics.csv (not finished)" in report.sections[3].notes
    html = write_report(run).read_text()
    assert "not finished (interrupted, failed or still running)" in html
    assert "no test_result.csv: test metrics not recorded" in html


def test_report_of_a_run_made_before_the_report_and_a_task_without_test_labels(regression_run, tmp_path):
    run = _copy(regression_run[0], tmp_path)
    (run / "fold_0/test_spread.csv").unlink()
    record = json.loads((run / "run.json").read_text())
    del record["folds"]
    (run / "run.json").write_text(json.dumps(record))
    with open(run / "fold_0/test_result.csv") as f:
        rows = list(csv.reader(f))
    for row in rows[2:]:
        row[4] = ""  # no measured tpsa_100 in the test set
    with open(run / "fold_0/test_result.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    report = finetune_report(run)
    assert report.image_count() == 1 + FIGURES_PER_TASK + KEY + WORST  # tpsa_100 has nothing to plot
    assert any("spread on the test set is not recorded" in n for n in report.sections[0].notes)
    assert report.sections[4].tables[0].rows[0][1:] == ["each member", "not recorded", "not recorded"]
    assert "the test set has no labels for tpsa_100: nothing to score or plot (not recorded)" in \
        report.sections[6].notes
    assert [line.split()[0] for line in report.sections[5].molecules[0].lines] == [
        "measured", "predicted", "error", "baseline"]  # no interval without the spread


@pytest.mark.slow  # a second finetune (~30 s here); the regression run covers the rest
def test_classification_report_has_roc_pr_and_confusion(classification_run):
    save_dir, _ = classification_run
    record = json.loads((save_dir / "run.json").read_text())["folds"]["fold_0"]
    result = read_test_result(save_dir / "fold_0" / "test_result.csv")
    assert record["positives"]["logp_high"]["test"] == int(np.nansum(result.targets[:, 0]))
    report = finetune_report(save_dir)
    task = report.sections[5]
    assert [f.caption for f in task.figures] == ["logp_high: ROC and precision-recall",
                                                 "logp_high: confusion matrix at p >= 0.5"]
    assert task.tables[0].columns == ["auc", "prc-auc", "accuracy", "matthews_corrcoef"]
    assert report.image_count() == 1 + 2 * (FIGURES_PER_TASK + KEY + WORST)


def test_a_run_on_separate_val_and_test_files_states_them_in_run_json_and_the_report(ray_cluster, tmp_path):
    """Upstream's summary line names split_type (random, the default) whatever the files: kept as it is, while
    run.json and the report say what the split was."""
    header, *rows = demo_rows(90)
    parts = {"data": rows[:60], "val": rows[60:75], "test": rows[75:]}
    for name, part in parts.items():
        with open(tmp_path / f"{name}.csv", "w", newline="") as f:
            csv.writer(f).writerows([header, *part])
    val, test = tmp_path / "val.csv", tmp_path / "test.csv"
    summary, out = tiny_finetune(tmp_path / "run", tmp_path / "data.csv", "--separate_val_path", str(val),
                                 "--separate_test_path", str(test))
    assert "overall_random_test_rmse" in summary and "overall_random_test_rmse=" in out
    split = f"given files: val {val}, test {test}; data_path: all for training"
    assert json.loads((tmp_path / "run" / "run.json").read_text())["split"] == split
    run_rows = dict(finetune_report(tmp_path / "run").sections[0].tables[0].rows)
    assert run_rows["split"] == split and "overall_random_test_rmse" in run_rows
    assert split in (tmp_path / "run" / "report.html").read_text()
