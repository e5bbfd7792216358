"""A real tiny finetune writes fold_0/domain.json + domain_embeddings.safetensors; `kermt predict
--applicability_domain` on the run serves them: the distances equal the library's on the same molecules (member 0's
embedding, the fold's index), the training molecules sit on the index, the test split is mostly in domain and other
chemotypes are not."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from kermt.checkpoint import load_finetune_model, read_checkpoint
from kermt.chem.standardize import MoleculePrep
from kermt.data.featurize import featurize_smiles
from kermt.uncertainty.domain import DOMAIN_ARRAYS_FILE, DOMAIN_FILE, DomainSearch, load_domain, model_embeddings
from tests.ray_app.screening.engines import main_predict
from tests.kermt.uncertainty.test_domain import OTHER_CHEMOTYPES
from tests.ray_app.finetune.tiny_runs import demo_head, tiny_finetune

# a finetune of its own (the shared runs in test_finetune.py have 8 validation molecules, below the 10 a threshold
# needs), one member, one epoch; like test_calibration.py, outside the default suite
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_with_domain(ray_cluster, tmp_path_factory):
    """(save_dir, stdout, the demo rows used): 150 molecules, 70/15/15 % random split."""
    base = tmp_path_factory.mktemp("domain_run")
    data, save_dir = demo_head(150, base / "data.csv"), base / "run"
    _, printed = tiny_finetune(save_dir, data, "--ensemble_size", "1", "--split_sizes", "0.7", "0.15", "0.15")
    return save_dir, printed, pd.read_csv(data)


def test_finetune_writes_the_fold_domain_and_predict_serves_it(run_with_domain, tmp_path):
    save_dir, out, data = run_with_domain
    fold = save_dir / "fold_0"
    record = json.loads((fold / DOMAIN_FILE).read_text())
    splits = json.loads((save_dir / "splits.json").read_text())["fold_0"]
    assert (fold / DOMAIN_ARRAYS_FILE).is_file() and record["k"] == 5 and record["quantile"] == 0.95
    assert record["n_training"] == record["n_training_total"] == len(splits["train"])
    assert record["held_out"]["n"] == len(splits["val"])
    assert "fold 0: applicability domain (domain.json)" in out
    query = tmp_path / "query.csv"
    smiles = data.smiles.iloc[splits["test"] + splits["train"][:5]].tolist() + OTHER_CHEMOTYPES
    pd.DataFrame({"smiles": smiles}).to_csv(query, index=False)
    output = tmp_path / "p.parquet"
    assert main_predict(["--data_path", str(query), "--output_path", str(output), "--checkpoint_dir", str(save_dir),
                         "--applicability_domain", "--batch_size", "32"]) == 0
    frame = pq.read_table(output).to_pandas()
    checkpoint = read_checkpoint(fold / "model_0" / "model")
    model, _ = load_finetune_model(checkpoint)
    index = load_domain(str(fold))
    # the model's own standardisation (every new finetune's parent, 8c565f3): ferrocene's largest organic fragment,
    # the cyclopentadienyl anion, has no neutral form RDKit reads back ('c1cccc1'), so the model sees the anion
    assert checkpoint.spec.features.standardize == "parent"
    prep = MoleculePrep(checkpoint.spec.features.standardize)
    embeddings = model_embeddings(model, featurize_smiles(smiles, prep=prep), 32)
    np.testing.assert_allclose(frame.domain_distance, DomainSearch(index).distances(embeddings), rtol=1e-6)
    ferrocene = smiles.index("[CH-]1C=CC=C1.[CH-]1C=CC=C1.[Fe+2]")
    assert frame.valid.all() and frame.model_smiles[ferrocene] == "c1cc[cH-]c1"
    n_test = len(splits["test"])
    inside = frame.in_domain.to_numpy(bool)
    assert inside[:n_test].mean() >= 0.7 and inside[n_test:n_test + 5].all() and not inside[n_test + 5:].any()
    train = model_embeddings(model, featurize_smiles(data.smiles.iloc[splits["train"]].tolist(), prep=prep), 16)
    near = DomainSearch(index).neighbour_distances(train)
    assert near[:, 0].max() <= 1e-3 * near[:, 1].min()  # the finetune's batches of 16: the same embeddings
