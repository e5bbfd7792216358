"""`kermt eval` writes <stem>_report.html beside its --output_path: the per-task plots of the scored file."""

from __future__ import annotations

import json

from ray_app.report.evaluation import eval_report
from ray_app.report.page import fmt
from tests.ray_app.screening.engines import main_eval
from tests.conftest import FIXTURE_DIR


def test_eval_writes_its_report_beside_the_output(tmp_path, capsys):
    out = tmp_path / "scored.csv"
    assert main_eval(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(out),
                      "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt")]) == 0
    assert f"report: {tmp_path / 'scored_report.html'}" in capsys.readouterr().out.splitlines()
    html = (tmp_path / "scored_report.html").read_text()
    assert "Task t1" in html and "Task t2" in html and "read as regression" in html
    # the model that scored the file colours the worst-predicted molecules, without --attributions too
    assert "red where the atom raises the prediction" in html and "attributions not drawn" not in html
    report = eval_report(out)
    assert report.image_count() == 2 * (2 + 8)
    assert [row for row in report.sections[1].tables[0].columns] == ["rmse", "mae", "r2", "spearmanr"]


def test_eval_of_a_calibrated_run_shows_its_interval_scores(regression_run, tmp_path, capsys):
    save_dir, _ = regression_run
    out = tmp_path / "again.csv"
    assert main_eval(["--data_path", str(save_dir.parent / "data.csv"), "--output_path", str(out),
                      "--checkpoint_dir", str(save_dir)]) == 0
    scores = json.loads((tmp_path / "again_uncertainty.json").read_text())
    table = eval_report(out).sections[0].tables[0]
    assert table.caption == f"{scores['level']} interval ({scores['method']} conformal) on this file"
    assert [row[0] for row in table.rows] == ["logp", "tpsa_100"]
    assert table.rows[0][1:] == [fmt(v) for v in scores["tasks"]["logp"].values()]
    assert f"report: {tmp_path / 'again_report.html'}" in capsys.readouterr().out.splitlines()


def test_eval_to_a_uri_uploads_its_report_beside_the_output(tmp_path, capsys):
    uri = f"file://{tmp_path}/remote/scored.csv"  # a URI pyarrow writes like any object store
    (tmp_path / "remote").mkdir()
    assert main_eval(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", uri,
                      "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"), "--attributions"]) == 0
    assert f"report: file://{tmp_path}/remote/scored_report.html" in capsys.readouterr().out.splitlines()
    # what eval writes beside its output goes up beside it too, not only the scored file and its report
    assert "t1_atoms" in (tmp_path / "remote" / "scored_attributions.csv").read_text().splitlines()[0]
    assert "Task t1" in (tmp_path / "remote" / "scored_report.html").read_text()
    assert (tmp_path / "remote" / "scored.csv").exists()
