"""A finetune whose --save_dir is a URI: the report goes up with the run's other files, and the line says where."""

from __future__ import annotations

import pytest

from ray_app.cli import main
from tests.conftest import FIXTURE_DIR
from tests.ray_app.finetune.tiny_runs import DEMO


@pytest.mark.slow  # one more finetune (~30 s here)
def test_finetune_to_a_uri_uploads_its_report(ray_cluster, tmp_path, capsys):
    import ray

    remote = tmp_path / "bucket" / "run"
    remote.mkdir(parents=True)
    assert main(["finetune", "--data_path", str(DEMO), "--max_data_size", "60", "--save_dir", f"file://{remote}",
                 "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"), "--epochs", "1",
                 "--batch_size", "16", "--ffn_hidden_size", "8",
                 "--address", ray.get_runtime_context().gcs_address]) == 0
    assert f"report: file://{remote}/report.html" in capsys.readouterr().out.splitlines()
    assert "Learning curves" in (remote / "report.html").read_text()
