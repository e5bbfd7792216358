"""The mean-variance (``--loss mve``) training loss: the Gaussian NLL of each view plus the disagreement term,
against a hand computation, and the variance head's outputs (shapes, floor, the mixture variance of the views)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.featurize import featurize_smiles
from kermt.nn.finetune import VARIANCE_FLOOR, KermtFinetuneModel
from kermt.train.losses import LabelledTargets, mve_two_view_terms, reduce_terms


def test_mve_terms_equal_a_hand_computation():
    atom = torch.tensor([[0.5, -1.0], [2.0, 0.0]])
    bond = torch.tensor([[0.3, -1.0], [1.0, 0.5]])
    atom_var = torch.tensor([[0.25, 1.0], [4.0, 0.5]])
    bond_var = torch.tensor([[1.0, 2.0], [0.5, 0.1]])
    targets = LabelledTargets.from_nan(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]))
    terms = mve_two_view_terms(atom, bond, atom_var, bond_var, targets, dist_coff=0.1)

    def nll(mu, var, y):
        return 0.5 * (math.log(var) + (y - mu) ** 2 / var)

    expected = [
        [nll(0.5, 0.25, 1.0) + nll(0.3, 1.0, 1.0) + 0.1 * 0.2**2, 0.0],  # the missing label contributes nothing
        [nll(2.0, 4.0, 0.0) + nll(1.0, 0.5, 0.0) + 0.1 * 1.0**2, nll(0.0, 0.5, 1.0) + nll(0.5, 0.1, 1.0) + 0.1 * 0.25],
    ]
    torch.testing.assert_close(terms, torch.tensor(expected), rtol=1e-6, atol=1e-7)
    # normalised by the (global) label count, as the mse loss: 3 labels here; 2 workers each scale by world size
    assert float(reduce_terms(terms, torch.tensor(3.0))) == pytest.approx(sum(map(sum, expected)) / 3, rel=1e-6)
    half = reduce_terms(terms[:1], torch.tensor(3.0), world_size=2) + reduce_terms(terms[1:], torch.tensor(3.0), 2)
    assert float(half) / 2 == pytest.approx(sum(map(sum, expected)) / 3, rel=1e-6)


def _tiny_config(variance: bool, task_layers: int = 0) -> FinetuneModelConfig:
    encoder = EncoderConfig(hidden_size=8, depth=2, num_attn_head=1, num_mt_block=1, dropout=0.1,
                            embedding_output_type="atom")
    head = HeadConfig(num_tasks=2, dataset_type="regression", ffn_hidden_size=6, dropout=0.1, variance=variance,
                      ffn_num_task_specific_layers=task_layers,
                      ffn_task_specific_hidden_size=5 if task_layers else None)
    return FinetuneModelConfig(encoder, ReadoutConfig(), head)


@pytest.mark.parametrize("task_layers", [0, 2])
def test_a_variance_head_gives_a_mean_and_a_floored_variance_per_task(task_layers):
    torch.manual_seed(0)
    model = KermtFinetuneModel(_tiny_config(True, task_layers)).eval()
    graph = featurize_smiles(["CCO", "c1ccccc1O", "CC(=O)N"]).batch_graph(model.kermt.aggregation_spec(False))
    out = model(graph)
    assert out.atom_view.shape == out.atom_variance.shape == (3, 2)
    assert (out.atom_variance >= VARIANCE_FLOOR).all() and (out.bond_variance >= VARIANCE_FLOOR).all()
    mixture = (out.atom_variance + out.bond_variance) / 2 + ((out.atom_view - out.bond_view) / 2) ** 2
    torch.testing.assert_close(out.variance, mixture)
    torch.testing.assert_close(out.prediction, (out.atom_view + out.bond_view) / 2)


def test_a_plain_head_has_no_variance_and_a_classifier_none_at_all():
    model = KermtFinetuneModel(_tiny_config(False)).eval()
    graph = featurize_smiles(["CCO"]).batch_graph(model.kermt.aggregation_spec(False))
    assert model(graph).variance is None and model(graph).atom_variance is None
    with pytest.raises(ValueError, match="variance head"):
        dataclasses.replace(_tiny_config(False).head, dataset_type="classification", variance=True)
