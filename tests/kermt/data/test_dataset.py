"""Batches of a MoleculeSet: vectorised selection, and bond dropout drawn per molecule."""

from __future__ import annotations

import numpy as np
import torch

from kermt.chem.molgraph import FlatGraphs
from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.collate import collate_graphs
from kermt.data.dataset import MoleculeSet, bond_keep_mask
from kermt.data.featurize import featurize_smiles
from kermt.data.sampling import worker_share
from kermt.data.tables import load_molecule_table
from kermt.nn.finetune import KermtFinetuneModel
from tests.conftest import FIXTURE_DIR


def _fixture_graphs() -> FlatGraphs:
    return featurize_smiles(load_molecule_table(FIXTURE_DIR / "smiles.csv").smiles).graphs


def test_select_equals_the_per_molecule_path():
    flat = _fixture_graphs()
    rows = np.array([7, 0, 21, 7, 3, 25])
    expected = FlatGraphs.from_graphs([flat.graphs()[i] for i in rows])
    got = flat.select(rows)
    for name in ("f_atoms", "bond_atoms", "bond_feats", "bond_rdkit_idx", "atom_counts", "bond_counts"):
        np.testing.assert_array_equal(getattr(got, name), getattr(expected, name), err_msg=name)


def test_dropped_bonds_disappear_from_the_batch_graph():
    flat = _fixture_graphs()
    rows = np.array([0, 1, 2])
    keep = np.ones(int(flat.bond_counts[rows].sum()), dtype=bool)
    keep[[0, 5]] = False  # molecule 0 loses its first and sixth bond
    full, dropped = collate_graphs(flat.select(rows)), collate_graphs(flat.select(rows, keep))
    assert dropped.f_bonds.shape[0] == full.f_bonds.shape[0] - 4  # two chemical bonds = four directed edges
    assert dropped.f_atoms.shape == full.f_atoms.shape
    assert dropped.b_scope[0, 1] == full.b_scope[0, 1] - 4 and (dropped.b_scope[1:, 1] == full.b_scope[1:, 1]).all()


def test_bond_dropout_of_a_molecule_is_the_same_in_any_batch():
    """Workers' shares of a global batch draw, molecule by molecule, the keep flags the whole batch draws."""
    flat = _fixture_graphs()
    data = MoleculeSet(flat, None, np.zeros((len(flat), 1), np.float32), tuple(str(i) for i in range(len(flat))))
    global_rows = np.array([4, 9, 1, 13, 22, 6, 0])
    keep = bond_keep_mask(global_rows, flat.bond_counts, 0.3, seed=5, step=2)
    parts = [bond_keep_mask(worker_share(global_rows, r, 3), flat.bond_counts, 0.3, 5, 2) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate(parts), keep)
    assert 0.15 < 1 - keep.mean() < 0.45  # about 30 % dropped
    assert not np.array_equal(bond_keep_mask(global_rows, flat.bond_counts, 0.3, 5, 3), keep)  # another step
    batch = data.batch(worker_share(global_rows, 1, 3), parts[1])
    assert batch.graph.num_molecules == len(worker_share(global_rows, 1, 3))
    assert batch.graph.molecule_ids.tolist() == worker_share(global_rows, 1, 3).tolist()
    kept = np.add.reduceat(parts[1], np.cumsum(np.r_[0, flat.bond_counts[worker_share(global_rows, 1, 3)][:-1]]))
    assert (batch.graph.b_scope[:, 1].numpy() == 2 * kept).all()  # two directed edges per kept bond


def _molecule_set() -> MoleculeSet:
    done = featurize_smiles(["CCO", "c1ccccc1O", "CC(=O)N", "C1CCNCC1"])
    targets = np.array([[0.5, np.nan], [np.nan, 0.0], [1.0, 2.0], [np.nan, np.nan]], dtype=np.float32)
    return MoleculeSet(done.graphs, None, targets, done.smiles)


def test_a_worker_batch_carries_its_global_batchs_label_counts():
    molecules, global_rows = _molecule_set(), np.array([3, 0, 2, 1])
    shares = [molecules.batch(rows, global_rows=global_rows) for rows in np.array_split(global_rows, 2)]
    per_worker = sum((~torch.isnan(share.targets)).sum(0) for share in shares)  # what an all-reduce would sum
    for share in shares:
        assert share.global_label_counts.tolist() == per_worker.tolist() == [2.0, 2.0]


def test_shares_as_wide_as_their_global_batch_get_the_whole_batchs_outputs():
    """With upstream's padding every empty neighbour slot adds the padding row, so a molecule's output depends on
    how wide its batch's neighbour tables are. Shares collated at their global batch's width (what every runner
    does) give each molecule what the whole batch gives; at their own width they do not."""
    smiles = ["CCO", "OCCO", "CC(C)(C)O", "CC(C)(C)C(=O)O"]  # largest degrees 2, 2, 4, 4
    done = featurize_smiles(smiles)
    molecules = MoleculeSet(done.graphs, None, np.zeros((4, 1), dtype=np.float32), done.smiles)
    global_rows = np.arange(4)
    shares = np.array_split(global_rows, 2)
    assert [molecules.neighbour_width(share) for share in shares] == [2, 4]
    width = molecules.neighbour_width(global_rows)
    torch.manual_seed(0)
    model = KermtFinetuneModel(FinetuneModelConfig(
        EncoderConfig(hidden_size=8, depth=3, num_attn_head=2, padding="upstream", embedding_output_type="atom"),
        ReadoutConfig(), HeadConfig(num_tasks=1, dataset_type="regression", ffn_hidden_size=6))).eval()
    spec = model.kermt.aggregation_spec(training=False)

    def predict(rows: np.ndarray, neighbour_width: int = 1) -> torch.Tensor:
        batch = molecules.batch(rows, operators=spec, neighbour_width=neighbour_width)
        with torch.no_grad():
            return model(batch.graph, None).prediction

    whole = predict(global_rows)
    torch.testing.assert_close(torch.cat([predict(share, width) for share in shares]), whole, rtol=0, atol=1e-6)
    own_width = torch.cat([predict(share) for share in shares])
    assert (own_width - whole).abs().max() > 1e-4
