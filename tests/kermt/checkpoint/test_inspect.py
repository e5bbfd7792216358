"""inspect_checkpoint on every fixture checkpoint and on a native directory."""

from __future__ import annotations

import json

import pytest

from kermt.checkpoint import convert_to_native, read_checkpoint
from kermt.checkpoint.inspect import inspect_path
from tests.conftest import FIXTURE_DIR

STRUCTURE = json.loads((FIXTURE_DIR / "ckpt_structure.json").read_text())
EXPECTED = {
    # name: (kind, task_names, dataset_type, readout self_attention, unique elements)
    "ckpt_pretrain_vocab": ("vocab", None, None, None, 77478 - 2 * 0),
    "ckpt_pretrain_hybrid": ("hybrid", None, None, None, 146617 - 60530),  # second encoder copy counted once
    "ckpt_ft_reg": ("finetuned", ["t1", "t2"], "regression", True, 77738 - 2),  # PReLU slope shared by 2 layers x 2
    "ckpt_ft_reg_ts": ("finetuned", ["t1", "t2"], "regression", True, None),
    "ckpt_ft_cls": ("finetuned", ["c1", "c2"], "classification", False, 62666 - 2),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_report_of_each_fixture(name):
    kind, tasks, dataset_type, self_attention, elements = EXPECTED[name]
    report = inspect_path(FIXTURE_DIR / f"{name}.pt")
    json.dumps(report)  # JSON-ready
    assert report["kind"] == kind and report["format"] == "upstream"
    assert report["tasks"]["task_names"] == tasks and report["tasks"]["dataset_type"] == dataset_type
    assert report["architecture"]["encoder"]["hidden_size"] == 16
    assert report["architecture"]["encoder"]["num_attn_head"] == 2
    assert report["tensors"] == STRUCTURE[name]["n_tensors"]
    assert sum(g["tensors"] for g in report["key_groups"].values()) == report["tensors"]
    assert sum(g["elements"] for g in report["key_groups"].values()) == STRUCTURE[name]["n_params_in_state_dict"]
    if elements is not None:
        assert report["parameters"] == elements
    if kind == "finetuned":
        assert report["architecture"]["readout"]["self_attention"] is self_attention
        assert report["load_check"]["ok"] is True and report["load_check"]["used"] == report["tensors"] - 14
    else:
        assert report["training_state"]["epoch"] == 0 and "load_check" not in report


def test_report_values_for_the_regression_checkpoint():
    report = inspect_path(FIXTURE_DIR / "ckpt_ft_reg.pt")
    assert report["scalers"]["data_scaler"]["means"] == pytest.approx([0.02153846, 0.34291667], abs=1e-8)
    assert report["scalers"]["features_scaler"] is None
    assert report["features"]["features_generator"] == ["rdkit_2d_normalized"]
    assert report["features"]["features_scaling"] is False
    assert report["architecture"]["head"]["features_size"] == 200
    assert report["key_groups"]["encoder_bond_branches"] == {"tensors": 14, "elements": 25442}
    assert report["warnings"] == []


def test_native_directory_reports_the_same_description(tmp_path):
    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg_ts.pt")
    directory = convert_to_native(checkpoint, tmp_path / "native")
    native, upstream = inspect_path(directory), inspect_path(FIXTURE_DIR / "ckpt_ft_reg_ts.pt")
    assert native["format"] == "native"
    for field in ("kind", "architecture", "tasks", "scalers", "features"):
        assert native[field] == upstream[field], field
    assert native["parameters"] == upstream["parameters"] - 25442 + 0  # bond branches live in passthrough
    assert native["load_check"]["ok"] is True and native["load_check"]["ignored"] == {}
