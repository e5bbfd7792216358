"""The features FFN (``head.features_ffn``): a descriptor model of its own beside the graph, which alone can carry
the prediction; saved and rebuilt with the model; never built for an upstream checkpoint."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kermt.checkpoint import CheckpointSpec, UnfaithfulExportError, load_finetune_model, read_checkpoint, \
    save_native
from kermt.checkpoint.export import export_upstream
from kermt.checkpoint.merge import ArchitectureConflictError, merge_finetune_config
from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.featurize import featurize_smiles
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.heads import build_ffn
from tests.conftest import FIXTURE_DIR

SMILES = ["CCO", "c1ccccc1O", "CC(=O)N", "CCCCN"]
FEATURES = 5


def _config(tasks: int = 2, variance: bool = False, features_ffn: bool = True) -> FinetuneModelConfig:
    encoder = EncoderConfig(hidden_size=8, depth=2, num_attn_head=1, activation="ReLU",
                            embedding_output_type="atom", padding="zero")
    head = HeadConfig(num_tasks=tasks, dataset_type="regression", features_size=FEATURES, ffn_hidden_size=6,
                      activation="ReLU", variance=variance, features_ffn=features_ffn)
    return FinetuneModelConfig(encoder, ReadoutConfig(), head)


def _inputs(model: KermtFinetuneModel) -> tuple:
    graph = featurize_smiles(SMILES).batch_graph(model.kermt.aggregation_spec(False))
    features = torch.linspace(-2.0, 2.0, len(SMILES) * FEATURES).reshape(len(SMILES), FEATURES)
    return graph, features


@pytest.mark.parametrize("variance", [False, True])
def test_with_the_graph_part_at_zero_the_model_is_the_descriptor_mlp(variance):
    torch.manual_seed(0)
    model = KermtFinetuneModel(_config(variance=variance)).eval()
    with torch.no_grad():
        for view in ("atom", "bond"):  # the last layer of each view's FFN outputs zero
            last = getattr(model, f"mol_atom_from_{view}_ffn")[-1]
            last.weight.zero_()
            last.bias.zero_()
    graph, features = _inputs(model)
    # the same layers, built and loaded on their own: an MLP that never sees a graph
    mlp = build_ffn(FEATURES, 6, 2, 2, 0.0, "ReLU").eval()
    mlp.load_state_dict(model.features_ffn.state_dict())
    expected = mlp(features)
    out = model(graph, features)
    torch.testing.assert_close(out.prediction, expected)
    torch.testing.assert_close(out.atom_view, out.bond_view)
    torch.testing.assert_close(out.from_features, expected)
    assert float(expected.detach().abs().sum()) > 0.1  # a real, non-trivial output
    if variance:  # the variance columns are the graph FFN's alone: softplus(0) + floor
        torch.testing.assert_close(out.atom_variance, torch.full((len(SMILES), 2), 0.693148), atol=1e-5, rtol=0)


def test_the_features_ffn_adds_to_what_the_graph_head_predicts():
    torch.manual_seed(1)
    model = KermtFinetuneModel(_config()).eval()
    graph, features = _inputs(model)
    out = model(graph, features)
    graph_alone = model.mol_atom_from_atom_ffn(torch.cat([out.readout_atom_view, features], dim=1))
    torch.testing.assert_close(out.atom_view, graph_alone + out.from_features)


def test_off_by_default_and_it_needs_features():
    model = KermtFinetuneModel(_config(features_ffn=False))
    assert model.features_ffn is None and not any(k.startswith("features_ffn") for k in model.state_dict())
    with pytest.raises(ValueError, match="features_ffn needs molecule features"):
        HeadConfig(num_tasks=1, dataset_type="regression", features_ffn=True)
    graph, _ = _inputs(KermtFinetuneModel(_config()))
    with pytest.raises(ValueError, match="needs the molecule features"):
        KermtFinetuneModel(_config())(graph)


def _finetuned_spec(config: FinetuneModelConfig) -> CheckpointSpec:
    return CheckpointSpec(kind="finetuned", encoder=config.encoder, readout=config.readout, head=config.head,
                          task_names=("a", "b"))


def test_a_saved_model_is_rebuilt_with_its_features_ffn_and_predicts_the_same(tmp_path):
    torch.manual_seed(2)
    model = KermtFinetuneModel(_config()).eval()
    graph, features = _inputs(model)
    save_native(tmp_path / "model", model.state_dict(), _finetuned_spec(model.config))
    checkpoint = read_checkpoint(tmp_path / "model")
    assert checkpoint.spec.head.features_ffn
    reloaded, report = load_finetune_model(checkpoint)
    assert report.ignored == {} and report.fresh == ()
    torch.testing.assert_close(reloaded.eval()(graph, features).prediction, model(graph, features).prediction,
                               rtol=0, atol=0)
    # upstream's padding, so that the features FFN is what stops the export
    spec = _finetuned_spec(dataclasses.replace(model.config, encoder=dataclasses.replace(model.config.encoder,
                                                                                         padding="upstream")))
    with pytest.raises(UnfaithfulExportError, match="features FFN"):
        export_upstream(tmp_path / "model.pt", model.state_dict(), spec)


@pytest.mark.parametrize("name", ["ft_reg", "ft_reg_ts", "ft_cls"])
def test_upstream_checkpoints_build_todays_head(name):
    checkpoint = read_checkpoint(FIXTURE_DIR / f"ckpt_{name}.pt")
    assert checkpoint.spec.head.features_ffn is False
    model, report = load_finetune_model(checkpoint)
    assert model.features_ffn is None and report.fresh == ()
    assert set(model.state_dict()) <= set(checkpoint.state_dict)  # every tensor built is one upstream saved


def test_a_finetuned_checkpoint_keeps_its_features_ffn_and_refuses_a_contradiction():
    spec = _finetuned_spec(_config())
    assert merge_finetune_config(spec).head.features_ffn
    with pytest.raises(ArchitectureConflictError, match="head.features_ffn: you set False"):
        merge_finetune_config(spec, head={"features_ffn": False})
