"""A library featurised once into shards (ray_app.screening.shards) predicts what its SMILES predict: in this
process and on Ray Data, with molecule features and without, across several shards; a model that featurises
otherwise is refused in one line; and the engine rule does not count a Ray session this process started itself as
a running cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kermt.chem.standardize import MoleculePrep
from kermt.errors import UserError
from ray_app.screening.config import PredictConfig
from ray_app.screening.files import InputTable
from ray_app.screening.run import run_predict
from ray_app.screening.shards import read_shards, write_shards
from ray_app.screening.stream import InputSpec
from tests.conftest import FIXTURE_DIR

ROOT = Path(__file__).resolve().parents[3]
REGRESSION, CLASSIFICATION = FIXTURE_DIR / "ckpt_ft_reg.pt", FIXTURE_DIR / "ckpt_ft_cls.pt"


def _predict(library: Path, checkpoint: Path, out: Path, engine: str, shards=None) -> pd.DataFrame:
    config = PredictConfig(data_path=str(library), checkpoint_path=str(checkpoint), output_path=str(out),
                           uncertainty=True, drop_extra_columns=True, engine=engine)
    assert run_predict(config, shards) == 0
    return pd.read_csv(out, keep_default_na=False)


def _same(from_shards: pd.DataFrame, from_smiles: pd.DataFrame) -> None:
    assert from_shards.columns.tolist() == from_smiles.columns.tolist()
    for name in from_smiles.columns:
        left, right = from_shards[name], from_smiles[name]
        if right.dtype.kind == "f":
            np.testing.assert_allclose(left.to_numpy(), right.to_numpy(), rtol=0, atol=1e-6, err_msg=name)
        else:
            assert left.tolist() == right.tolist(), name


def test_shards_predict_what_the_smiles_predict_in_this_process(tmp_path):
    library = FIXTURE_DIR / "smiles.csv"  # 26 molecules: charged, salts, stereo, one heavy atom
    spec = InputSpec("smiles", features_generator=("rdkit_2d_normalized",), prep=MoleculePrep())
    shards = write_shards(InputTable.open(str(library)), spec, tmp_path / "library", None, batch_size=32)
    assert (shards.rows, shards.files) == (26, ("shard_000000.parquet",))
    assert read_shards(tmp_path / "library") == shards  # the manifest says what was written
    from_shards = _predict(library, REGRESSION, tmp_path / "shards.csv", "local", shards)
    from_smiles = _predict(library, REGRESSION, tmp_path / "smiles.csv", "local")
    assert from_smiles["valid"].sum() >= 20 and any(c.endswith("_std") for c in from_smiles.columns)
    _same(from_shards, from_smiles)


def test_shards_written_and_read_on_ray_predict_what_the_smiles_predict(ray_cluster, tmp_path):
    smiles = pd.read_csv(FIXTURE_DIR / "smiles.csv")["smiles"].tolist()
    library = tmp_path / "big.csv"
    pd.DataFrame({"smiles": smiles * 50}).to_csv(library, index=False)  # 1,300 rows: two shards of 1,024 + 276
    spec = InputSpec("smiles", prep=MoleculePrep())  # the classification fixture takes no molecule features
    shards = write_shards(InputTable.open(str(library)), spec, tmp_path / "library", None, batch_size=32)
    assert shards.rows == 1300 and len(shards.files) == 2  # featurised on Ray: the test session is a cluster
    from_shards = _predict(library, CLASSIFICATION, tmp_path / "shards.csv", "ray", shards)
    from_smiles = _predict(library, CLASSIFICATION, tmp_path / "smiles.csv", "local")
    assert from_smiles["smiles"].tolist() == smiles * 50
    _same(from_shards, from_smiles)


def test_a_model_that_featurises_otherwise_is_refused(tmp_path):
    library = FIXTURE_DIR / "smiles.csv"
    shards = write_shards(InputTable.open(str(library)), InputSpec("smiles", prep=MoleculePrep()),
                          tmp_path / "library", None, batch_size=32)
    with pytest.raises(UserError, match="featurised as .* the model needs .*rdkit_2d_normalized"):
        _predict(library, REGRESSION, tmp_path / "p.csv", "local", shards)
    assert not (tmp_path / "p.csv").exists()


ENGINE_SCRIPT = """
import json, sys
from ray_app.common.cluster import connect
from ray_app.screening.engines import auto_engine

connect(num_cpus=1)  # a session this process starts for its own work (kermt explore's finetune does)
print(json.dumps({"own_session": auto_engine(sys.argv[1], None)}))
"""


def test_a_ray_session_this_process_started_is_not_a_running_cluster(tmp_path):
    library = FIXTURE_DIR / "smiles.csv"
    done = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT, str(library)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"own_session": "local"}
    assert "engine: local (a small local input" in done.stderr


def test_a_cluster_this_process_joined_streams_on_ray(ray_cluster):
    from ray_app.screening.engines import auto_engine

    assert auto_engine(str(FIXTURE_DIR / "smiles.csv"), None) == "ray"  # the session's cluster counts as joined
