"""`kermt eval` writes <stem>_report.html beside its --output_path: the per-task plots of the scored file."""

from __future__ import annotations

from ray_app.report.evaluation import eval_report
from ray_app.screening.commands import main_eval
from tests.conftest import FIXTURE_DIR


def test_eval_writes_its_report_beside_the_output(ray_cluster, tmp_path, capsys):
    out = tmp_path / "scored.csv"
    assert main_eval(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(out),
                      "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt")]) == 0
    assert f"report: {tmp_path / 'scored_report.html'}" in capsys.readouterr().out.splitlines()
    html = (tmp_path / "scored_report.html").read_text()
    assert "Task t1" in html and "Task t2" in html and "read as regression" in html
    report = eval_report(out)
    assert report.image_count() == 2 * (2 + 8)
    assert [row for row in report.sections[1].tables[0].columns] == ["rmse", "mae", "r2", "spearmanr"]
