"""Bad files handed to the library and the entry points, made for real here (a truncated .pt, a directory without a
checkpoint, a damaged native checkpoint, a bad folds file, infinite features, an argless checkpoint): each is a
UserError whose one-line report names the file (and row/column/key) and says what to do. Nothing starts Ray."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from kermt import cli as kermt_cli
from kermt.checkpoint import (ArchitectureConflictError, CheckpointMismatchError, convert_to_native,
                              load_finetune_model, merge_encoder, read_checkpoint)
from kermt.data.feature_files import load_features
from kermt.data.splits import crossval_split, index_predetermined_split, predetermined_split
from kermt.errors import UserError, one_line
from ray_app import cli as ray_cli
from ray_app.screening.config import PredictConfig
from ray_app.screening.run import plan_predict
from tests.conftest import FIXTURE_DIR

FT_REG = FIXTURE_DIR / "ckpt_ft_reg.pt"  # regression, rdkit_2d_normalized (200 features)
SMILES_CSV = str(FIXTURE_DIR / "smiles.csv")


class _RunsCode:
    def __reduce__(self):
        return (os.getcwd, ())


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad_inputs")
    raw = FT_REG.read_bytes()
    (root / "truncated.pt").write_bytes(raw[: len(raw) // 2])  # no zip directory left: fails the sniff
    _with_half_pickle(FT_REG, root / "corrupt.pt")  # a readable zip whose pickle is cut: passes the sniff
    state = torch.load(FT_REG, weights_only=False)
    torch.save(state, root / "legacy.pt", _use_new_zipfile_serialization=False)
    legacy = (root / "legacy.pt").read_bytes()
    (root / "legacy_truncated.pt").write_bytes(legacy[: len(legacy) // 2])
    torch.save([1, 2], root / "a_list.pt")
    torch.save({"weights": state["state_dict"]}, root / "no_state_dict.pt")
    torch.save({**state, "extra": _RunsCode()}, root / "runs_code.pt")
    torch.save({**state, "state_dict": {**state["state_dict"], "mystery.weight": torch.zeros(2)}},
               root / "extra_tensor.pt")
    args = vars(state["args"]).copy()
    torch.save({**state, "args": type(state["args"])(**{**args, "hidden_size": 32})}, root / "inconsistent.pt")
    torch.save({"state_dict": state["state_dict"], "features_scaler": state["features_scaler"]}, root / "argless.pt")
    (root / "empty_dir").mkdir()
    native = root / "native"
    convert_to_native(read_checkpoint(FT_REG), native)
    shutil.copytree(native, root / "native_bad_json")
    (root / "native_bad_json" / "config.json").write_text("{not json")
    shutil.copytree(native, root / "native_truncated")
    weights = root / "native_truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return root


def _with_half_pickle(source: Path, target: Path) -> None:
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, data[: len(data) // 2] if info.filename.endswith("data.pkl") else data)


def _inspect_error(argv: list[str], capsys) -> str:
    assert kermt_cli.main(["inspect", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kermt inspect: error: "), lines
    return lines[0]


CHECKPOINT_CASES = {
    "truncated.pt": ["truncated.pt is not a checkpoint (expected a torch .pt file"],
    "corrupt.pt": ["corrupt.pt cannot be read (unpack requires", "truncated or corrupt", "copy or download it again"],
    "legacy_truncated.pt": ["legacy_truncated.pt cannot be read", "unexpected EOF", "copy or download it again"],
    "a_list.pt": ["a_list.pt holds a list, expected a dict", "pass a checkpoint saved by KERMT"],
    "no_state_dict.pt": ["no_state_dict.pt: no 'state_dict' entry", "pass a model.pt saved by KERMT or GROVER"],
    "runs_code.pt": ["refusing to load checkpoint", "runs_code.pt", "getcwd", "--trust_checkpoint"],
    "inconsistent.pt": ["inconsistent.pt: saved args say hidden_size=32 but the tensors imply", "edited or damaged"],
    "empty_dir": ["empty_dir is a directory but not a native kermt checkpoint", "pass the .pt file itself"],
    "native_bad_json": ["native_bad_json/config.json: cannot read it as JSON", "copy it again"],
    "native_truncated": ["native_truncated/model.safetensors: cannot read it as safetensors", "copy the checkpoint"],
}


@pytest.mark.parametrize("name", list(CHECKPOINT_CASES))
def test_bad_checkpoint_is_one_line_naming_the_file(files, name, capsys):
    line = _inspect_error([str(files / name)], capsys)
    for words in CHECKPOINT_CASES[name]:
        assert words in line, line


def test_argless_checkpoint_takes_dataset_type_from_the_user(files, capsys):
    """A finetuned file with neither saved args nor a data_scaler entry: --dataset_type decides, never a guess."""
    line = _inspect_error([str(files / "argless.pt")], capsys)
    assert "argless.pt" in line and "pass --dataset_type regression|classification" in line
    assert kermt_cli.main(["inspect", str(files / "argless.pt"), "--dataset_type", "classification"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["architecture"]["head"]["dataset_type"] == "classification"
    assert "dataset_type='classification' given (not stored in the checkpoint)" in json.dumps(report)


def _error_line(stderr: str, command: str) -> str:
    """The error: the last stderr line (progress lines such as 'ensemble of 1 model(s)' may come first)."""
    assert "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"kermt {command}: error: ") and stderr.count(" error: ") == 1, stderr
    return line


def _predict_config(files: Path, **settings) -> PredictConfig:
    return PredictConfig(data_path=SMILES_CSV, output_path=str(files / "out.csv"), **settings)


def test_predict_and_eval_pass_dataset_type_to_an_argless_checkpoint(files, capsys):
    features = files / "features.npz"
    np.savez(features, features=np.zeros((3, 200)))
    config = _predict_config(files, checkpoint_path=str(files / "argless.pt"), features_path=[str(features)])
    with pytest.raises(UserError, match="pass --dataset_type"):
        plan_predict(config)
    plan = plan_predict(config.model_copy(update={"dataset_type": "regression"}))
    assert plan.members[0].spec.head.dataset_type == "regression"
    argv = ["--data_path", SMILES_CSV, "--output_path", str(files / "r.csv"), "--checkpoint_path", str(FT_REG),
            "--dataset_type", "classification"]
    for command in ("predict", "eval"):
        assert ray_cli.main([command, *argv]) == 2
        line = _error_line(capsys.readouterr().err, command)
        assert line.startswith(f"kermt {command}: error: ") and "ckpt_ft_reg.pt: the checkpoint was trained as " \
            "regression but dataset_type='classification'" in line and "drop --dataset_type" in line


PREDICT_CASES = {
    "empty directory": (["--checkpoint_dir", "{root}/empty_dir"],
                        ["--checkpoint_dir", "empty_dir: no checkpoint under it", "pass the --save_dir"]),
    "missing directory": (["--checkpoint_dir", "{root}/nowhere"],
                          ["--checkpoint_dir", "nowhere is not a directory (it does not exist)"]),
    "pretraining member": (["--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")],
                           ["ckpt_pretrain_vocab.pt is a vocab (pretraining) checkpoint", "kermt fingerprint"]),
    "wrong features": (["--checkpoint_path", str(FT_REG), "--features_generator", "morgan"],
                       ["--features_generator morgan does not match the checkpoint", "rdkit_2d_normalized"]),
    "infinite feature": (["--checkpoint_path", str(FT_REG), "--features_path", "{root}/inf.npz"],
                         ["inf.npz: row 1", "column 7 is -inf", "Features must be finite"]),
}


@pytest.mark.parametrize("case", list(PREDICT_CASES))
def test_predict_input_errors_are_one_line_before_ray(files, case, capsys):
    values = np.zeros((3, 200))
    values[1, 7] = -np.inf
    np.savez(files / "inf.npz", features=values)
    flags, words = PREDICT_CASES[case]
    argv = ["predict", "--data_path", SMILES_CSV, "--output_path", str(files / "p.csv"),
            *(f.format(root=files) for f in flags)]
    assert ray_cli.main(argv) == 2
    line = _error_line(capsys.readouterr().err, "predict")
    for word in words:
        assert word in line, line


def test_infinite_features_name_file_row_and_column(tmp_path):
    values = np.ones((4, 3))
    values[2, 1] = np.inf
    values[0, 0] = np.nan  # missing: becomes 0, as upstream
    np.savez(tmp_path / "f.npz", features=values)
    with pytest.raises(UserError, match=r"f\.npz: row 2 \(data row 2, counted from 0\), column 1 is \+inf; 1 infinite"):
        load_features(tmp_path / "f.npz")
    np.savez(tmp_path / "g.npz", features=values, valid=np.array([True, True, False, True]))
    features, valid = load_features(tmp_path / "g.npz")  # an invalid row's values are never used
    assert valid.tolist() == [True, True, False, True] and features[0, 0] == 0.0


def _split_error(call) -> str:
    with pytest.raises(UserError) as info:
        call()
    return one_line(str(info.value))


def test_bad_folds_and_index_files_name_the_file_and_the_fix(tmp_path):
    folds = tmp_path / "folds.json"
    folds.write_text(json.dumps([[0, 1], [2, 3]]))
    line = _split_error(lambda: predetermined_split(folds, 5, None, (0.8, 0.2, 0.0), 0, 4))
    assert "folds.json: --test_fold_index 5 requested but the file holds 2 folds; use a --test_fold_index in [0, 2)" \
        in line
    line = _split_error(lambda: predetermined_split(folds, 0, 1, (0.8, 0.2, 0.0), 0, 3))
    assert "folds.json: val index 3 is not a row index in [0, 3)" in line and "regenerate the index file" in line
    broken = tmp_path / "broken.json"
    broken.write_text("[[0, 1], [2")
    assert "broken.json: not valid JSON" in _split_error(lambda: index_predetermined_split(broken, 0, 4))
    (tmp_path / "mapping.json").write_text('{"train": [0]}')
    assert "mapping.json: expected a JSON list (one entry per fold), got dict" in _split_error(
        lambda: index_predetermined_split(tmp_path / "mapping.json", 0, 4))
    assert "missing.json: cannot read it" in _split_error(lambda: index_predetermined_split(tmp_path / "missing.json",
                                                                                             0, 4))
    index = tmp_path / "index.json"
    index.write_text(json.dumps([[["a"], ["b"], ["c"]]]))
    assert "index.json: fold 1 requested but the file holds 1 folds; run with --num_folds 1 or fewer" in \
        _split_error(lambda: crossval_split(tmp_path, index, 1, 4))
    assert "a.json: cannot read it" in _split_error(lambda: crossval_split(tmp_path, index, 0, 4))


def test_checkpoint_that_does_not_fit_its_model_names_the_file(files):
    with pytest.raises(CheckpointMismatchError) as info:
        load_finetune_model(read_checkpoint(files / "extra_tensor.pt"))
    line = one_line(str(info.value))
    assert isinstance(info.value, UserError) and "extra_tensor.pt: checkpoint does not fit the model" in line
    assert "unexpected key 'mystery.weight'" in line and "use the checkpoint as it was saved" in line


def test_architecture_conflict_is_a_user_error():
    spec = read_checkpoint(FT_REG).spec
    with pytest.raises(ArchitectureConflictError) as info:
        merge_encoder(spec.encoder, {"hidden_size": spec.encoder.hidden_size + 1}, str(FT_REG))
    assert isinstance(info.value, UserError)
    assert "ckpt_ft_reg.pt" in one_line(str(info.value)) and "Remove these settings" in str(info.value)
