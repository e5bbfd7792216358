"""kermt.inference.shared: blocks sharing forwards get the numbers each gets alone, for upstream's own checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from kermt.inference import Ensemble, atom_budget_starts, plan_features, read_members
from kermt.inference.shared import predict_blocks
from tests.conftest import FIXTURE_DIR
from tests.kermt.test_inference import SMILES

# a single atom (degree 0), an invalid row, a quaternary carbon and a sulfonic acid (degree 4) beside the sample
MOLECULES = SMILES + ["C", "not_a_smiles", "CC(C)(C)C", "O=S(=O)(O)c1ccccc1"]


def _blocks(generator: tuple[str, ...], seed: int) -> list[FeaturizedMolecules]:
    cuts = np.sort(np.random.default_rng(seed).choice(np.arange(1, len(MOLECULES)), 6, replace=False))
    return [featurize_smiles(list(part), generator) for part in np.split(np.array(MOLECULES, dtype=object), cuts)]


@pytest.mark.parametrize("name", ["ft_reg", "ft_reg_ts", "ft_cls"])
@pytest.mark.parametrize("max_atoms", [None, 60])
def test_shared_forwards_give_each_block_its_own_numbers(name, max_atoms):
    members = read_members([FIXTURE_DIR / f"ckpt_{name}.pt"])
    ensemble = Ensemble(members)
    blocks = _blocks(plan_features([m.spec for m in members]).generator, seed=len(name))
    shared = predict_blocks(ensemble, blocks, 4, max_atoms=max_atoms)
    alone = [ensemble.predict(block, 4) for block in blocks]
    for own, got in zip(alone, shared):
        np.testing.assert_allclose(got.mean, own.mean, rtol=1e-6, atol=1e-6)  # NaN rows where own has them
        np.testing.assert_allclose(got.std, own.std, rtol=1e-6, atol=1e-6)
    # the test can fail: upstream's batching of the same blocks moves the numbers
    upstream = Ensemble(members, upstream_batching=True)
    batch_dependent = np.concatenate([upstream.predict(block, 4).mean for block in blocks])
    assert np.nanmax(np.abs(np.concatenate([a.mean for a in alone]) - batch_dependent)) > 1e-3


def test_blocks_are_not_shared_under_upstream_batching():
    ensemble = Ensemble(read_members([FIXTURE_DIR / "ckpt_ft_cls.pt"]), upstream_batching=True)
    with pytest.raises(ValueError, match="upstream_batching"):
        predict_blocks(ensemble, _blocks((), seed=0), 4)


def test_atom_budget_starts():
    assert atom_budget_starts(np.array([3, 3, 3, 10, 1, 1]), batch_size=100, max_atoms=6) == [0, 2, 3, 4]
    assert atom_budget_starts(np.array([1, 1, 1]), batch_size=2, max_atoms=100) == [0, 2]
    assert atom_budget_starts(np.array([], dtype=np.int64), batch_size=2, max_atoms=5) == []
