"""An explicit from-scratch architecture far too large for the data gets one warning line with its parameter count,
before Ray starts (issue 38); a checkpoint's model, the default architecture and a model that fits get none. No
cluster fixture: none of this needs one."""

from __future__ import annotations

from pathlib import Path

import pytest

from ray_app import cli
from ray_app.finetune.config import resolve
from ray_app.finetune.inputs import check_finetune_inputs
from ray_app.finetune.model_size import oversized_model_line
from tests.conftest import FIXTURE_DIR
from tests.ray_app.finetune.tiny_runs import demo_head


@pytest.fixture(scope="module")
def data_csv(tmp_path_factory) -> Path:
    """100 molecules: about 80 train, so more than 80,000 parameters is over the limit."""
    return demo_head(100, tmp_path_factory.mktemp("size") / "data.csv")


def test_a_model_far_too_large_is_one_line_with_the_count_the_run_builds(data_csv, tmp_path, capsys):
    """Through the command line, with --dry_run, which builds the run's model: the warning's count is the dry
    run's, and it comes before the plan."""
    argv = ["finetune", "--data_path", str(data_csv), "--save_dir", str(tmp_path / "run"), "--hidden_size", "64",
            "--depth", "2", "--dry_run"]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    parameters = next(line for line in lines if line.startswith("model: ")).split()[1]
    assert int(parameters.replace(",", "")) > 80_000
    warnings = [line for line in lines if "warning" in line]
    assert warnings == [f"warning: the from-scratch model (--hidden_size 64 --depth 2) has {parameters} parameters, "
                        f"over 1,000 per training molecule (about 80 of {data_csv}'s 100 rows): likely to overfit; "
                        "it is trained as given, but a smaller one suits this data"]
    assert lines.index(warnings[0]) < lines.index("resolved configuration (* = default):")
    assert "fold 0: train 80, val 10, test 10" in lines  # the split the estimate names


@pytest.mark.parametrize("flags", [
    ["--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"), "--ffn_hidden_size", "4000"],  # pretrained
    [],  # the default architecture (the from-scratch recipe's, over 80,000 here) is not the user's to resize
    ["--hidden_size", "16", "--depth", "2", "--features_generator"],  # no descriptors: under 80,000 parameters
], ids=["checkpoint", "default", "fits"])
def test_no_warning_for_a_checkpoint_the_default_or_a_model_that_fits(data_csv, tmp_path, flags):
    config, sources = resolve(["--data_path", str(data_csv), "--save_dir", str(tmp_path), *flags])
    assert oversized_model_line(config, sources, check_finetune_inputs(config)) is None
