"""Per-molecule dropout draws: a molecule's masks do not depend on its batch, the drop rate is right, the stacked
and the encoder-by-encoder message passing draw the same masks, and outside a per-molecule block nothing changes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from kermt.nn.aggregate import GraphIndex
from kermt.nn.pretrain.decoder_layers import RopeDecoderLayer
from kermt.random_streams import depth_rng
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.keyed_dropout import MoleculeDraws, dropout, hash32, per_molecule_draws
from kermt.nn.mpn import MPNEncoder, PassingMode, dropout_streams, run_encoders, run_encoders_stacked

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccccc1", "C1CCNCC1", "OC(=O)C(N)Cc1ccccc1", "CCN(CC)CC", "O=C1CCCCC1"]
P = 0.3


@pytest.fixture(scope="module")
def molecules() -> MoleculeSet:
    done = featurize_smiles(SMILES)
    targets = np.zeros((len(SMILES), 2), dtype=np.float32)
    return MoleculeSet(done.graphs, None, targets, done.smiles)


def _atom_rows(graph, i: int) -> slice:
    start, count = graph.a_scope[i].tolist()
    return slice(start, start + count)


def _bond_rows(graph, i: int) -> slice:
    start, count = graph.b_scope[i].tolist()
    return slice(start, start + count)


def test_hash32_is_the_same_on_python_ints_and_int64_tensors():
    values = [0, 1, 2, 12345, 2**31 - 1, 2**32 - 1]
    hashed = hash32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert hashed == [hash32(v) for v in values]
    assert all(0 <= h < 2**32 for h in hashed) and len(set(hashed)) == len(values)


def test_a_molecule_draws_the_same_masks_in_a_whole_batch_and_in_half_batches(molecules):
    """World-size independence: worker 0 of 2 and worker 1 of 2 draw, for each of their molecules, exactly the rows
    that one worker with the whole batch draws for it (atoms, bonds and molecule rows; several calls)."""
    whole, first, second = np.array([5, 0, 3, 6, 1, 4]), np.array([5, 0, 3]), np.array([6, 1, 4])
    masks = {}
    for name, rows in (("whole", whole), ("first", first), ("second", second)):
        graph = molecules.batch(rows).graph
        draws = MoleculeDraws(seed=7, step=12, graph=graph)
        shapes = {"atom": (graph.f_atoms.shape[0], 5), "bond": (graph.f_bonds.shape[0], 3, 2),
                  "molecule": (len(rows), 4)}
        masks[name] = (graph, {kind: draws.keep_scale(torch.Size(shape), P, kind, [0, 1], torch.float32, "cpu")
                               for kind, shape in shapes.items()})
    graph_w, whole_masks = masks["whole"]
    for half, offset in (("first", 0), ("second", 3)):
        graph_h, half_masks = masks[half]
        for i in range(3):
            j = i + offset
            for kind, rows_of in (("atom", _atom_rows), ("bond", _bond_rows)):
                torch.testing.assert_close(half_masks[kind][:, rows_of(graph_h, i)],
                                           whole_masks[kind][:, rows_of(graph_w, j)], rtol=0, atol=0)
            torch.testing.assert_close(half_masks["molecule"][:, i], whole_masks["molecule"][:, j], rtol=0, atol=0)
    # and the draws are not trivially equal: streams, steps and molecules differ
    atom = whole_masks["atom"]
    assert not torch.equal(atom[0], atom[1])
    other_step = MoleculeDraws(seed=7, step=13, graph=graph_w).keep_scale(atom.shape[1:], P, "atom", [0],
                                                                         torch.float32, "cpu")
    assert not torch.equal(other_step[0], atom[0])


def test_the_drop_rate_and_scale_are_right():
    graph = featurize_smiles(["C" * 40] * 50).graphs
    batch = MoleculeSet(graph, None, np.zeros((50, 1), np.float32), tuple(["x"] * 50)).batch(np.arange(50))
    graph = replace(batch.graph, molecule_ids=batch.graph.molecule_ids + 10**6)  # large ids (a corpus's rows)
    draws = MoleculeDraws(seed=1, step=0, graph=graph)
    rows = graph.f_atoms.shape[0]  # 2001 rows x 300 columns x 2 streams = 1.2M draws
    scale = draws.keep_scale(torch.Size((rows, 300)), P, "atom", [3, 4], torch.float32, "cpu")[:, 1:]
    dropped = (scale == 0).double()
    n = dropped.numel()
    assert abs(dropped.mean().item() - P) < 4 * (P * (1 - P) / n) ** 0.5
    assert torch.all((scale == 0) | torch.isclose(scale, torch.tensor(1 / (1 - P))))
    assert abs(scale.mean().item() - 1.0) < 0.005
    # no structure: every row, every column and the two streams' overlap behave like independent draws
    per_column, per_row = dropped.mean(dim=(0, 1)), dropped.mean(dim=(0, 2))
    assert abs(per_column - P).max() < 5 * (P * (1 - P) / (2 * 2000)) ** 0.5
    assert abs(per_row - P).max() < 5.5 * (P * (1 - P) / 600) ** 0.5
    both = (dropped[0] * dropped[1]).mean().item()
    assert abs(both - P * P) < 4 * (P * P * (1 - P * P) / (n / 2)) ** 0.5


def test_outside_a_per_molecule_block_dropout_is_torchs():
    x = torch.randn(9, 4)
    torch.manual_seed(3)
    expected = torch.nn.functional.dropout(x, P, True)
    torch.manual_seed(3)
    torch.testing.assert_close(dropout(x, P, True, "atom"), expected, rtol=0, atol=0)


def test_bf16_applies_the_fp32_mask(molecules):
    graph = molecules.batch(np.arange(3)).graph
    x = torch.randn(graph.f_atoms.shape[0], 6)
    with per_molecule_draws(2, 5, graph):
        full = dropout(x, P, True, "atom", stream=0)
        half = dropout(x.bfloat16(), P, True, "atom", stream=0)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), full, rtol=1e-2, atol=1e-2)
    assert torch.equal(half == 0, full == 0)


@pytest.mark.parametrize("atom_messages", [True, False], ids=["node", "edge"])
def test_stacked_and_encoder_by_encoder_passing_draw_the_same_masks(molecules, atom_messages):
    graph = molecules.batch(np.arange(5)).graph
    rows = graph.f_atoms.shape[0] if atom_messages else graph.f_bonds.shape[0]
    torch.manual_seed(0)
    iterations = [3, 0, 1, 4, 2, 3]
    encoders = [MPNEncoder(6, True, "PReLU").double() for _ in iterations]
    inp = torch.randn(rows, 6, dtype=torch.float64)
    index = GraphIndex.from_batch(graph, "zero", torch.float64)
    mode = PassingMode(atom_messages, dropout=P, training=True)
    outputs = {}
    for name in ("loop", "stacked"):
        with per_molecule_draws(4, 9, graph):
            streams = dropout_streams(iterations)
            if name == "loop":
                outputs[name] = torch.stack(run_encoders(encoders, inp, iterations, index, mode, streams))
            else:
                outputs[name] = run_encoders_stacked(encoders, inp, iterations, index, mode, streams)
    torch.testing.assert_close(outputs["stacked"], outputs["loop"], rtol=1e-12, atol=1e-12)
    with per_molecule_draws(4, 9, graph):
        no_dropout = run_encoders_stacked(encoders, inp, iterations, index, PassingMode(atom_messages, 0.0, True),
                                          dropout_streams(iterations))
    assert not torch.allclose(no_dropout, outputs["loop"])  # the masks did drop something


def _model(dropout_rate: float) -> KermtFinetuneModel:
    torch.manual_seed(0)
    encoder = EncoderConfig(hidden_size=8, depth=3, num_attn_head=2, dropout=dropout_rate, padding="zero")
    head = HeadConfig(num_tasks=2, dataset_type="regression", ffn_hidden_size=6, ffn_num_layers=3,
                      ffn_num_task_specific_layers=2, ffn_task_specific_hidden_size=5, dropout=dropout_rate)
    return KermtFinetuneModel(FinetuneModelConfig(encoder, ReadoutConfig(self_attention=True), head)).train()


def test_a_train_mode_forward_of_half_batches_equals_the_whole_batchs(molecules):
    """The whole model (MTBlocks, attention, encoder FFNs, shared and task-specific heads) in train mode with
    dropout: two half batches give each molecule the outputs the whole batch gives it."""
    model = _model(P)
    spec = model.kermt.aggregation_spec(training=True)

    def forward(rows: np.ndarray, step: int = 12) -> torch.Tensor:
        graph = molecules.batch(rows, operators=spec).graph
        with per_molecule_draws(5, step, graph):
            out = model(graph, None, depth_rng(5, step))
        return torch.cat([out.atom_view, out.bond_view], dim=1)

    whole = forward(np.arange(6))
    halves = torch.cat([forward(np.arange(3)), forward(np.arange(3, 6))])
    torch.testing.assert_close(halves, whole, rtol=0, atol=1e-6)
    assert not torch.allclose(forward(np.arange(6), step=13), whole)  # another step, other masks
    model.eval()
    with torch.no_grad():
        graph = molecules.batch(np.arange(6), operators=spec).graph
        out = model(graph, None)
    assert not torch.allclose(torch.cat([out.atom_view, out.bond_view], dim=1), whole)  # dropout did act


def test_the_rope_decoder_layer_draws_per_molecule(molecules):
    """Token tensors [B, L, d] are keyed by molecule: a half batch gives each molecule the whole batch's output; the
    explicit attention used under per-molecule draws equals scaled_dot_product_attention when nothing drops."""
    torch.manual_seed(0)
    layer = RopeDecoderLayer(8, 2, 16, P, gate_self=True, gate_cross=False).train()
    x, memory = torch.randn(4, 5, 8), torch.randn(4, 1, 8)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None] & (torch.arange(5) < 4)[None, None, None, :]
    graphs = {rows: molecules.batch(np.array(rows)).graph for rows in ((0, 1, 2, 3), (2, 3))}
    with per_molecule_draws(1, 2, graphs[(0, 1, 2, 3)]):
        whole = layer(x, memory, mask)
    with per_molecule_draws(1, 2, graphs[(2, 3)]):
        half = layer(x[2:], memory[2:], mask)
    torch.testing.assert_close(half, whole[2:], rtol=0, atol=1e-6)
    layer.dropout_p = layer.dropout.p = 1e-12  # keyed, explicit attention, nothing dropped
    with per_molecule_draws(1, 2, graphs[(0, 1, 2, 3)]):
        explicit = layer(x, memory, mask)
    layer.eval()
    torch.testing.assert_close(explicit, layer(x, memory, mask), rtol=0, atol=1e-6)
    assert not torch.allclose(explicit, whole)
