"""Train-mode behaviour: dynamic depth draws, and every trainable parameter receives a gradient (no DDP
``find_unused_parameters`` needed)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.nn.depth import draw_depths
from kermt.random_streams import depth_rng
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.heads import initialize_weights
from tests.kermt.nn.upstream_fixtures import fixture_batch


def test_global_rng_draws_equal_upstreams_scalar_draws():
    """Upstream draws one scalar per encoder from numpy's global RNG; one vector draw gives the same depths."""
    np.random.seed(3)
    upstream = [int(stats.truncnorm(-3, 3, loc=6, scale=1).rvs()) for _ in range(24)]
    np.random.seed(3)
    assert draw_depths(6, 24) == upstream
    assert all(3 <= d <= 9 for d in upstream)


def test_seeded_draws_are_reproducible_per_step():
    assert draw_depths(6, 12, depth_rng(7, 100)) == draw_depths(6, 12, depth_rng(7, 100))
    assert draw_depths(6, 48, depth_rng(7, 100)) != draw_depths(6, 48, depth_rng(7, 101))


def test_train_forward_is_reproducible_with_a_depth_rng():
    model = _small_model(depth=4).train()
    outs = []
    for _ in range(2):
        torch.manual_seed(0)
        outs.append(model(fixture_batch(), torch.ones(26, 3), depth_rng=depth_rng(0, 5)).atom_view)
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def _small_model(depth: int, **head) -> KermtFinetuneModel:
    config = FinetuneModelConfig(
        encoder=EncoderConfig(hidden_size=8, depth=depth, num_attn_head=2, num_mt_block=2, dropout=0.1, bias=True),
        readout=ReadoutConfig(self_attention=True, attn_hidden=3, attn_out=2),
        head=HeadConfig(num_tasks=2, dataset_type="classification", features_size=3, ffn_hidden_size=5,
                        ffn_num_layers=3, dropout=0.1, **head),
        use_mtl_loss=True,
    )
    torch.manual_seed(0)
    model = KermtFinetuneModel(config)
    return model


def test_every_trainable_parameter_gets_a_gradient():
    """depth >= 5 keeps every sampled depth >= 2, so W_h always runs. (With depth <= 4 an encoder may draw a
    depth of 1: zero iterations, so its W_h gets no gradient in that step, exactly as upstream.) Blocks >= 2
    never use their input projection (W_i, act_func, layernorm): it is frozen, so it is not trainable."""
    model = _small_model(depth=5, ffn_num_task_specific_layers=2, ffn_task_specific_hidden_size=4).train()
    out = model(fixture_batch(), torch.ones(26, 3), depth_rng=depth_rng(0, 0))
    loss = (out.atom_view.sum() + out.bond_view.sum()) * model.mtl_log_sigma.sum()
    loss.backward()
    no_grad = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert no_grad == []
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {
        f"kermt.encoders.{stack}.1.{param}"
        for stack in ("edge_blocks", "node_blocks")
        for param in ("W_i.weight", "W_i.bias", "act_func.weight", "layernorm.weight", "layernorm.bias")
    } | {"readout.cached_zero_vector"}


def test_single_block_model_has_no_unused_parameters():
    config = FinetuneModelConfig(
        encoder=EncoderConfig(hidden_size=8, depth=5, num_attn_head=2),
        readout=ReadoutConfig(),
        head=HeadConfig(num_tasks=1, dataset_type="regression"),
    )
    model = KermtFinetuneModel(config).train()
    out = model(fixture_batch(), None, depth_rng=depth_rng(1, 1))
    (out.atom_view.sum() + out.bond_view.sum()).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_shared_activation_and_initialisation():
    model = _small_model(depth=3)
    ffn = model.mol_atom_from_atom_ffn
    assert ffn[2] is ffn[5]  # one PReLU reused, as upstream
    assert model.state_dict()["mol_atom_from_atom_ffn.2.weight"].data_ptr() == \
        model.state_dict()["mol_atom_from_atom_ffn.5.weight"].data_ptr()
    initialize_weights(model)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            assert p.abs().sum() == 0, name
        else:
            assert p.std() > 0, name
