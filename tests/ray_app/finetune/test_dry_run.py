"""`kermt finetune --dry_run` without Ray: the settings (defaults marked), the data checks and the plan, nothing
written; a bad input still ends it with its one-line error. No cluster fixture here: a dry run needs none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ray_app import cli
from ray_app.finetune.config import resolve
from ray_app.finetune.run import run_finetune
from tests.conftest import FIXTURE_DIR
from tests.ray_app.finetune.tiny_runs import demo_head

PRETRAINED = str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")
NOT_CHECKED = ("the cluster's CPUs and GPUs, and whether a run's workers fit, are checked when the run starts")


def in_subprocess(argv: list[str]) -> tuple[str, bool]:
    """(what `kermt ARGV` printed, whether it imported ray), run in a fresh interpreter: the proof that Ray was not
    started is that it was not even imported."""
    code = ("import contextlib, io, json, sys\nfrom ray_app.cli import main\nout = io.StringIO()\n"
            f"with contextlib.redirect_stdout(out):\n    status = main({argv!r})\n"
            "print(json.dumps([status, out.getvalue(), 'ray' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    status, out, imported_ray = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == 0, done.stderr[-2000:]
    return out, imported_ray


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a directory)."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def data_csv(tmp_path_factory) -> Path:
    """40 molecules of the demo file (3 regression tasks) and, as lines 5 and 9, two that no run can use."""
    path = demo_head(40, tmp_path_factory.mktemp("dry") / "data.csv")
    lines = path.read_text().splitlines()
    lines.insert(4, "not_a_smiles,1.0,,")
    lines.insert(8, "C1CC,2.0,0.5,")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_dry_run_plans_without_ray_even_with_an_address(data_csv, tmp_path):
    save_dir = tmp_path / "run"
    out, imported_ray = in_subprocess(
        ["finetune", "--data_path", str(data_csv), "--checkpoint_path", PRETRAINED, "--save_dir", str(save_dir),
         "--num_workers", "2", "--ensemble_size", "2", "--num_folds", "2", "--address", "127.0.0.1:9",
         "--dry_run"])
    assert not imported_ray
    lines = out.splitlines()
    assert "  * max_lr: 0.001" in lines and "    num_workers: 2" in lines
    assert "dataset_type=regression (inferred from the labels) metric=rmse tasks=['logp', 'tpsa_100', 'fsp3']" in lines
    assert any(line.startswith(f"{data_csv}: 42 rows, 40 with a valid SMILES; 2 skipped (line 5: ")
               and "line 9: " in line for line in lines)
    assert "fold 0: train 32, val 4, test 4" in lines and "fold 1: train 32, val 4, test 4" in lines
    assert f"checkpoint {PRETRAINED} (vocab):" in lines and "  loaded 66 tensors" in lines
    assert ("would train 2 model(s) x 2 fold(s) = 4 run(s) of 30 epoch(s), as many at once as the cluster's free "
            "resources hold when the run starts, each with 2 worker(s) (1 CPU each)") in lines
    assert f"a run starts anew in {save_dir}" in lines
    assert lines[-1] == ("resources are not checked by a dry run (the Ray cluster at 127.0.0.1:9 was not "
                         f"contacted): {NOT_CHECKED}")
    assert not save_dir.exists()


def test_the_plan_is_returned_and_an_earlier_run_is_left_as_it_was(data_csv, tmp_path, capsys):
    save_dir = tmp_path / "run"
    (save_dir / "fold_0" / "model_0").mkdir(parents=True)
    (save_dir / "fold_0" / "model_0" / "metrics.csv").write_text("epoch\n0\n")
    (save_dir / "config.yaml").write_text("epochs: 3\n")
    before = tree(save_dir)
    config, sources = resolve(["--data_path", str(data_csv), "--save_dir", str(save_dir), "--hidden_size", "8",
                               "--max_concurrent_trials", "3", "--use_gpu", "--dry_run"])
    plan = run_finetune(config, sources)  # the library entry point plans too, without Ray
    assert plan["folds"] == {"fold_0": {"train": 32, "val": 4, "test": 4}}
    assert plan["dataset_type"] == "regression" and plan["runs"] == 1 and plan["model_parameters"] > 0
    assert plan["resources_per_run"] == {"CPU": 1.0, "GPU": 1.0}
    lines = capsys.readouterr().out.splitlines()
    assert (f"{save_dir} holds an earlier run with other settings or no run record: a run moves its outputs to "
            f"{save_dir / 'earlier_runs'}/ first") in lines
    assert any("at most 1 at once (--max_concurrent_trials), each with 1 worker(s) (1 CPU and 1 GPU each)" in line
               for line in lines)
    assert lines[-1] == f"resources are not checked by a dry run (no Ray cluster was started): {NOT_CHECKED}"
    assert tree(save_dir) == before


@pytest.mark.parametrize("flags,message", [
    (["--on_invalid", "error"], "2 invalid SMILES (--on_invalid error): line 5: "),
    (["--checkpoint_path", PRETRAINED, "--hidden_size", "32"],
     "hidden_size: you set 32 but the checkpoint was trained with 16"),
])
def test_a_bad_input_ends_the_dry_run_with_its_one_line_error(data_csv, tmp_path, capsys, flags, message):
    """Found while featurising and while settling the model: the steps the dry run does itself, here."""
    assert cli.main(["finetune", "--data_path", str(data_csv), "--save_dir", str(tmp_path / "run"), "--dry_run",
                     *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # checked before anything is printed
    assert message in captured.err.strip().splitlines()[-1]
    assert captured.err.strip().splitlines()[-1].startswith("kermt finetune: error: ")
    assert not (tmp_path / "run").exists()
