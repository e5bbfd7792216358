"""GTransEncoder: upstream parity ("both" outputs of all fixture ckpts), padding modes, full-size key lists."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.batch import BatchMolGraph
from kermt.nn.encoder import KermtEmbedding
from kermt.nn.finetune import KermtFinetuneModel
from tests.kermt.nn.upstream_fixtures import (
    encoder_config_from_args,
    encoder_state,
    fixture_batch,
    load_upstream_checkpoint,
    outputs,
    read_key_list,
)

ENCODER_CKPTS = {
    "ckpt_pretrain_vocab.pt": "pt_vocab",
    "ckpt_pretrain_hybrid.pt": "pt_hybrid",
    "ckpt_ft_reg.pt": "ft_reg",
    "ckpt_ft_reg_ts.pt": "ft_reg_ts",
    "ckpt_ft_cls.pt": "ft_cls",
}
BRANCHES = ("atom_from_atom", "atom_from_bond", "bond_from_atom", "bond_from_bond")


def _loaded_encoder(ckpt_name: str, **overrides) -> KermtEmbedding:
    ckpt = load_upstream_checkpoint(ckpt_name)
    config = dataclasses.replace(encoder_config_from_args(ckpt["args"], "both"), **overrides)
    encoder = KermtEmbedding(config)
    encoder.load_state_dict(encoder_state(ckpt["state_dict"]), strict=True)
    return encoder.eval()


@pytest.mark.parametrize("ckpt_name", sorted(ENCODER_CKPTS))
def test_both_outputs_match_upstream(ckpt_name):
    prefix = ENCODER_CKPTS[ckpt_name]
    with torch.no_grad():
        result = _loaded_encoder(ckpt_name)(fixture_batch())
    for branch in BRANCHES:
        expected = outputs()[f"{prefix}_enc_{branch}"]
        np.testing.assert_allclose(getattr(result, branch).numpy(), expected, rtol=0, atol=1e-5, err_msg=branch)


def _single_molecule(graph: BatchMolGraph, mol: int) -> BatchMolGraph:
    """Molecule ``mol`` of a batch as its own batch (padding row + its rows, indices shifted)."""
    a_start, a_size = (int(v) for v in graph.a_scope[mol])
    b_start, b_size = (int(v) for v in graph.b_scope[mol])
    atoms = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(a_start, a_start + a_size)])
    bonds = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(b_start, b_start + b_size)])

    def shift(index: torch.Tensor, start: int) -> torch.Tensor:
        return torch.where(index == 0, index, index - start + 1)

    a2b = shift(graph.a2b[atoms], b_start)
    width = max(int((a2b != 0).sum(1).max()), 1)
    a2b = torch.sort(a2b, dim=1, descending=True).values[:, :width]  # real ids first, as the collator does
    b2a = shift(graph.b2a[bonds], a_start)
    return BatchMolGraph(
        f_atoms=graph.f_atoms[atoms],
        f_bonds=graph.f_bonds[bonds],
        a2b=a2b,
        b2a=b2a,
        b2revb=shift(graph.b2revb[bonds], b_start),
        a_scope=torch.tensor([[1, a_size]]),
        b_scope=torch.tensor([[1, b_size]]),
        a2a=b2a[a2b],
    )


def test_zero_padding_makes_outputs_independent_of_batch_mates():
    graph = fixture_batch()
    encoder = _loaded_encoder("ckpt_pretrain_vocab.pt", padding="zero")
    with torch.no_grad():
        batched = encoder(graph)
        for mol in (0, 5, 12, 25):
            alone = encoder(_single_molecule(graph, mol))
            a_start, a_size = (int(v) for v in graph.a_scope[mol])
            b_start, b_size = (int(v) for v in graph.b_scope[mol])
            for branch in BRANCHES:
                start, size = (a_start, a_size) if branch.startswith("atom") else (b_start, b_size)
                together = getattr(batched, branch)[start : start + size]
                np.testing.assert_allclose(getattr(alone, branch)[1:], together, rtol=0, atol=1e-5)


def test_upstream_padding_depends_on_batch_mates():
    """The upstream quirk the "zero" mode removes: the padding row leaks into every neighbour sum."""
    graph = fixture_batch()
    encoder = _loaded_encoder("ckpt_pretrain_vocab.pt")
    with torch.no_grad():
        together = encoder(graph).atom_from_atom[1:22]  # aspirin-sized first molecule (degree < batch max 6)
        alone = encoder(_single_molecule(graph, 0)).atom_from_atom[1:]
    assert together.shape[0] >= alone.shape[0]
    assert not torch.allclose(alone, together[: alone.shape[0]], atol=1e-3)


def _keys_and_shapes(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(key, tuple(value.shape)) for key, value in module.state_dict().items()]


@pytest.mark.parametrize(
    ("fixture", "hidden"),
    [("keys_full_grover_base_encoder.txt", 800), ("keys_full_grover_large_encoder.txt", 1200)],
)
def test_full_size_encoder_keys(fixture, hidden):
    with torch.device("meta"):
        encoder = KermtEmbedding(EncoderConfig(hidden_size=hidden, embedding_output_type="both"))
    assert _keys_and_shapes(encoder) == read_key_list(fixture)


def test_release_finetune_keys_are_upstreams_minus_bond_branches():
    config = FinetuneModelConfig(
        encoder=EncoderConfig(hidden_size=800, depth=6, num_attn_head=4, embedding_output_type="both"),
        readout=ReadoutConfig(self_attention=True, attn_hidden=4, attn_out=8),
        head=HeadConfig(num_tasks=1, dataset_type="regression", features_size=200, ffn_hidden_size=700,
                        ffn_num_layers=3),
    )
    with torch.device("meta"):
        model = KermtFinetuneModel(config)
    upstream = read_key_list("keys_full_finetune_release_readme.txt")
    ours = _keys_and_shapes(model)
    dropped = [row for row in upstream if row not in ours]
    assert [row for row in upstream if row in ours] == ours
    bond_branches = {"ffn_bond_from_atom", "ffn_bond_from_bond", "bond_from_atom_sublayer", "bond_from_bond_sublayer"}
    assert dropped
    assert {key.split(".")[2] for key, _ in dropped} == bond_branches
    assert all(key.startswith("kermt.encoders.") for key, _ in dropped)
