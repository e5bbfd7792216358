"""Safe loading: upstream files load with weights_only + allowlist; pickles that would run code are refused."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.serialization import get_unsafe_globals_in_checkpoint

from kermt.checkpoint.safe_load import UnsafeCheckpointError, load_pickled_checkpoint
from kermt.errors import UserError
from tests.conftest import FIXTURE_DIR

STRUCTURE = json.loads((FIXTURE_DIR / "ckpt_structure.json").read_text())
FIXTURE_NAMES = sorted(STRUCTURE)


class _ShellOnUnpickle:
    """Unpickling this runs a shell command (the classic malicious checkpoint)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _write_marker(path):
    with open(path, "w") as handle:
        handle.write("ran")


class _WriteOnUnpickle:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (_write_marker, (self.marker,))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_upstream_fixtures_load_safely_with_their_entries(name):
    state = load_pickled_checkpoint(FIXTURE_DIR / f"{name}.pt")
    expected = STRUCTURE[name]
    assert list(state) == list(expected["top_level_keys"])
    assert isinstance(state["args"], argparse.Namespace)
    assert isinstance(state["state_dict"], OrderedDict)
    assert len(state["state_dict"]) == expected["n_tensors"]
    assert sum(t.numel() for t in state["state_dict"].values()) == expected["n_params_in_state_dict"]
    assert vars(state["args"])["hidden_size"] == expected["args"]["hidden_size"]
    if expected.get("data_scaler"):
        means = state["data_scaler"]["means"]
        assert isinstance(means, np.ndarray) and means.dtype == np.float64
        np.testing.assert_allclose(means, [0.02153846, 0.34291667], atol=1e-8)


@pytest.mark.parametrize("legacy_format", [False, True], ids=["zip", "legacy"])
def test_code_running_pickle_is_refused_and_nothing_runs(tmp_path, legacy_format):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save({"args": _ShellOnUnpickle(marker), "state_dict": {}}, path,
               _use_new_zipfile_serialization=not legacy_format)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_pickled_checkpoint(path)
    message = str(info.value)
    assert str(path) in message
    assert "system" in message  # the offending global (posix.system / nt.system)
    assert "trust_pickle=True" in message and "--trust_checkpoint" in message
    assert not marker.exists()


def test_trust_pickle_is_a_real_full_unpickle(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "custom.pt"
    torch.save({"args": _WriteOnUnpickle(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match="_write_marker"):
        load_pickled_checkpoint(path)
    assert not marker.exists()
    load_pickled_checkpoint(path, trust_pickle=True)
    assert marker.read_text() == "ran"


def _last_checkpoint_state() -> dict:
    """Shaped like upstream's last_checkpoint.pt: model entries + Adam state + NoamLR state (numpy inside)."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler = {"warmup_epochs": np.array([1.0]), "total_epochs": np.array([3]), "steps_per_epoch": 3,
                 "init_lr": np.array([1e-4]), "current_step": 7, "lr": [np.float64(5e-4)], "base_lrs": [1e-4]}
    return {"args": argparse.Namespace(hidden_size=16, seed=np.int64(0)), "epoch": 2,
            "state_dict": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler,
            "data_scaler": {"means": np.zeros(2), "stds": np.ones(2)}, "features_scaler": None}


@pytest.mark.parametrize("legacy_format", [False, True], ids=["zip", "legacy"])
def test_resumable_checkpoint_with_optimizer_and_numpy_scheduler_loads(tmp_path, legacy_format):
    path = tmp_path / "last_checkpoint.pt"
    original = _last_checkpoint_state()
    torch.save(original, path, _use_new_zipfile_serialization=not legacy_format)
    state = load_pickled_checkpoint(path)
    assert state["epoch"] == 2 and state["scheduler"]["current_step"] == 7
    assert state["scheduler"]["lr"][0] == np.float64(5e-4)
    assert torch.equal(state["optimizer"]["state"][0]["exp_avg"], original["optimizer"]["state"][0]["exp_avg"])
    assert vars(state["args"]) == {"hidden_size": 16, "seed": 0}


def test_numpy1_module_names_of_old_grover_files_are_allowed(tmp_path):
    """numpy 1.x pickled scaler arrays as numpy.core.multiarray._reconstruct; numpy 2 renamed the module."""
    path = tmp_path / "old.pt"
    torch.save({"data_scaler": {"means": np.arange(3.0), "stds": np.ones(3)}}, path,
               _use_new_zipfile_serialization=False)
    raw = path.read_bytes()
    assert b"numpy._core.multiarray\n_reconstruct" in raw
    path.write_bytes(raw.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n"))
    state = load_pickled_checkpoint(path)
    np.testing.assert_array_equal(state["data_scaler"]["means"], np.arange(3.0))


def test_missing_file_and_non_dict_are_clear_errors(tmp_path):
    with pytest.raises(UserError, match="nope.pt does not exist"):
        load_pickled_checkpoint(tmp_path / "nope.pt")
    torch.save(torch.zeros(2), tmp_path / "tensor.pt")
    with pytest.raises(ValueError, match="expected a dict"):
        load_pickled_checkpoint(tmp_path / "tensor.pt")


def _floor(package: str) -> tuple[int, ...]:
    """The ``>=`` floor of ``package`` in pyproject.toml's dependencies, as a version tuple."""
    text = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    match = re.search(rf'^\s*"{package}>=([0-9.]+)"', text, re.MULTILINE)
    assert match, f"{package} has no >= floor in pyproject.toml"
    return tuple(int(part) for part in match.group(1).split("."))


def test_dependency_floors_cover_what_safe_loading_uses():
    # torch.serialization.safe_globals arrived in torch 2.5; get_unsafe_globals_in_checkpoint and (callable, name)
    # allowlist entries in 2.6. The fixtures pickle numpy._core.* names, which numpy 2.0 introduced.
    assert _floor("torch") >= (2, 6)
    assert _floor("numpy") >= (2, 0)
    assert "numpy._core.multiarray._reconstruct" in get_unsafe_globals_in_checkpoint(FIXTURE_DIR / "ckpt_ft_reg.pt")
