"""Settings that only fail together (dataset type x metric, a finetuned model x fingerprint source) are refused
through the CLI entry point before Ray starts: one line ``kermt <cmd>: error: ...``, exit status 2."""

from __future__ import annotations

import pytest

from kermt.metric_names import METRICS_FOR
from kermt.metrics import METRICS
from ray_app import cli
from tests.conftest import FIXTURE_DIR

REGRESSION_CSV = str(FIXTURE_DIR / "smiles.csv")  # smiles,t1,t2 with continuous labels
CLASSIFICATION_CSV = str(FIXTURE_DIR / "smiles_cls.csv")
FT_REG = str(FIXTURE_DIR / "ckpt_ft_reg.pt")
FT_CLS = str(FIXTURE_DIR / "ckpt_ft_cls.pt")


def error_line(capsys, argv: list[str]) -> str:
    """The one line a user error prints, last on stderr (the command must fail before Ray starts: no cluster in
    these tests; progress lines such as "ensemble of 1 model(s)" may come before it)."""
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line for line in lines if ": error: " in line] == lines[-1:], lines
    return lines[-1]


def test_metric_lists_cover_every_metric_once():
    names = [name for group in METRICS_FOR.values() for name in group]
    assert sorted(names) == sorted(METRICS) and len(set(names)) == len(names)


@pytest.mark.parametrize("command", ["finetune", "tune"])
@pytest.mark.parametrize("given", [True, False])
def test_a_classification_metric_of_regression_labels_is_refused(capsys, tmp_path, command, given):
    argv = [command, "--data_path", REGRESSION_CSV, "--metric", "auc", "--save_dir", str(tmp_path), "--dry_run"]
    argv += ["--dataset_type", "regression"] if given else []
    argv += ["--n_trials", "2"] if command == "tune" else []
    line = error_line(capsys, argv)
    origin = "" if given else " (inferred from the labels)"
    assert line == (f"kermt {command}: error: --metric auc does not apply to dataset_type regression{origin}; "
                    "for regression choose one of rmse, mae, r2, spearmanr")


def test_a_regression_metric_of_inferred_classification_labels_is_refused(capsys, tmp_path):
    line = error_line(capsys, ["finetune", "--data_path", CLASSIFICATION_CSV, "--metric", "r2",
                               "--save_dir", str(tmp_path), "--dry_run"])
    assert line.endswith("--metric r2 does not apply to dataset_type classification (inferred from the labels); "
                         "for classification choose one of auc, prc-auc, accuracy, recall, sensitivity, "
                         "specificity, matthews_corrcoef")


def test_a_val_file_whose_labels_are_not_0_1_is_refused_when_classification_is_inferred(capsys, tmp_path):
    (tmp_path / "val.csv").write_text("smiles,y\nCCO,0\nCCC,0.5\n")
    (tmp_path / "train.csv").write_text("smiles,y\nCCO,0\nCCN,1\nCCCC,1\n")
    line = error_line(capsys, ["finetune", "--data_path", str(tmp_path / "train.csv"), "--separate_val_path",
                               str(tmp_path / "val.csv"), "--save_dir", str(tmp_path), "--dry_run"])
    assert "val.csv: line 3, column 'y': label 0.5 is not 0 or 1" in line


def test_eval_refuses_a_metric_of_the_other_dataset_type(capsys, tmp_path):
    line = error_line(capsys, ["eval", "--data_path", REGRESSION_CSV, "--checkpoint_path", FT_REG,
                               "--output_path", str(tmp_path / "out.csv"), "--metric", "accuracy"])
    assert line == ("kermt eval: error: --metric accuracy does not apply to dataset_type regression (from the "
                    "checkpoint); for regression choose one of rmse, mae, r2, spearmanr")


@pytest.mark.parametrize("source", ["both", "bond"])
def test_bond_fingerprints_of_a_finetuned_model_are_refused(capsys, tmp_path, source):
    """Finetuning trains the atom-output branches only: the bond half would be the pretrained weights."""
    line = error_line(capsys, ["fingerprint", "--data_path", REGRESSION_CSV, "--checkpoint_path", FT_REG,
                               "--output_path", str(tmp_path / "fps.npz"), "--fingerprint_source", source])
    assert line.startswith(f"kermt fingerprint: error: --fingerprint_source {source} needs bond-output branches, "
                           f"but {FT_REG} is a finetuned model: finetuning trains only the atom-output branches")
    assert line.endswith("use --fingerprint_source atom, or the pretrained checkpoint for bond fingerprints")
    assert not (tmp_path / "fps.npz").exists()


def test_fingerprint_source_defaults_to_atom_for_a_finetuned_model_and_both_otherwise():
    from kermt.checkpoint import read_checkpoint
    from kermt.inference import Embedder

    assert Embedder(read_checkpoint(FT_CLS)).default_source == "atom"
    assert Embedder(read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")).default_source == "both"


def test_uncertainty_of_one_model_warns_that_a_spread_needs_an_ensemble(capsys, tmp_path):
    from ray_app.screening.config import PredictConfig
    from ray_app.screening.run import plan_predict

    warning = ("warning: --uncertainty with one model writes <task>_std = 0: a spread needs an ensemble of two or "
               "more members (--checkpoint_dir), a model trained with --loss mve, or --dropout_samples N")
    common = dict(data_path=REGRESSION_CSV, output_path=str(tmp_path / "p.csv"), uncertainty=True)
    plan_predict(PredictConfig(checkpoint_path=FT_REG, **common))
    assert warning in capsys.readouterr().err.splitlines()
    for name in ("a.pt", "b.pt"):
        (tmp_path / name).write_bytes(open(FT_REG, "rb").read())
    assert len(plan_predict(PredictConfig(checkpoint_dir=str(tmp_path), **common)).members) == 2
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--target_columns", "c1", "--use_mtl_loss"],
     f"--use_mtl_loss weighs each task's loss against the others', so it needs at least 2 tasks; {CLASSIFICATION_CSV} "
     "has 1 (c1): drop the flag or add --target_columns"),
    (["--ffn_num_task_specific_layers", "2"],
     "--ffn_num_task_specific_layers 2 needs --ffn_task_specific_hidden_size (the width the shared FFN hands each "
     "task's layers)"),
])
def test_model_settings_the_worker_would_refuse_are_refused_first(capsys, tmp_path, flags, message):
    """The model checks these only when it is built, in each member's training worker."""
    line = error_line(capsys, ["finetune", "--data_path", CLASSIFICATION_CSV, "--save_dir", str(tmp_path),
                               "--dry_run", *flags])
    assert line == f"kermt finetune: error: {message}"


@pytest.mark.parametrize("command", ["predict", "eval"])
def test_an_interval_given_as_a_percentage_names_the_level(capsys, tmp_path, command):
    line = error_line(capsys, [command, "--data_path", REGRESSION_CSV, "--checkpoint_path", FT_REG,
                               "--output_path", str(tmp_path / "out.csv"), "--interval", "90"])
    assert line == (f"kermt {command}: error: invalid {command} configuration: setting 'interval': 90 is a "
                    "percentage, but a level is a fraction in (0, 1): did you mean 0.9?")


def test_a_serve_request_with_a_percentage_interval_names_the_level():
    from pydantic import ValidationError

    from ray_app.serve.schemas import PredictRequest

    with pytest.raises(ValidationError, match=r"did you mean 0.95\?"):
        PredictRequest(smiles=["CCO"], interval=95)
    assert PredictRequest(smiles=["CCO"], interval=0.95).interval == 0.95


LAYOUT_MISTAKES = {  # a file as a new user hands it -> the cause the error names
    "';'-separated": ("smiles;t1\nCCO;1.2\nCCC;0.5\n", "looks ';'-separated (its header reads as the one column "
                      "'smiles;t1'); a .csv is read comma-separated: save it with commas"),
    "tab-separated": ("smiles\tt1\nCCO\t1.2\nCCC\t0.5\n", "looks tab-separated (its header reads as the one column "
                      "'smiles\\tt1'); a .csv is read comma-separated: save it with commas"),
    "SMILES not first": ("name,smiles,t1\nethanol,CCO,1.2\npropane,CCC,0.5\n", "the first column, 'name', is read "
                         "as SMILES but holds no valid SMILES in its first 2 filled rows (e.g. 'ethanol'); did you "
                         "mean `--smiles_column smiles`?"),
    "no SMILES": ("id,t1\nA1,1.2\nA2,0.5\n", "the first column, 'id', is read as SMILES but holds no valid SMILES in "
                  "its first 2 filled rows (e.g. 'A1': unparsable: syntax error while parsing: A1; check for mistakes "
                  "around position 1); fix them, or name the SMILES column with --smiles_column"),
}


@pytest.mark.parametrize("mistake", list(LAYOUT_MISTAKES))
@pytest.mark.parametrize("command", ["finetune", "tune", "predict", "eval"])
def test_a_file_laid_out_wrong_names_the_likely_cause(capsys, tmp_path, command, mistake):
    """Training files and the files predict and eval read: one line before Ray starts (the SMILES column with no
    SMILES failed in a worker after the cluster started; the others as 'the file has only ['smiles;t1']' and
    "label 'CCO' is not a number")."""
    content, cause = LAYOUT_MISTAKES[mistake]
    path = tmp_path / "data.csv"
    path.write_text(content)
    argv = [command, "--data_path", str(path)]
    if command in ("predict", "eval"):
        argv += ["--checkpoint_path", FT_REG, "--output_path", str(tmp_path / "out.csv")]
    else:
        argv += ["--save_dir", str(tmp_path / "run")] + (["--n_trials", "2"] if command == "tune" else [])
    assert error_line(capsys, argv) == f"kermt {command}: error: {path}: {cause}"
