"""KermtPretrainModel against upstream: state_dict layout, strict loading, and eval-mode numbers (outputs.npz)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from kermt.checkpoint import read_checkpoint
from kermt.config import EncoderConfig
from kermt.data.batch import BatchMolGraph
from kermt.nn.pretrain.decoder import reconstruction_terms
from kermt.nn.encoder import KermtEmbedding
from kermt.nn.fingerprint import KermtFingerprint
from tests.kermt.loss_oracles import cmim_terms, pretrain_loss, vocab_loss
from kermt.nn.pretrain.config import PretrainHeadsConfig, PretrainLossConfig, configs_from_settings
from kermt.nn.pretrain.model import KermtPretrainModel, PretrainBatch
from kermt.nn.pretrain.vocab_heads import VocabTargets
from tests.conftest import FIXTURE_DIR
from tests.kermt.nn.upstream_fixtures import encoder_state, fixture_batch
from tests.kermt.nn.upstream_fixtures import outputs as upstream_outputs

TOL = dict(rtol=0, atol=1e-5)
FIXTURE_ENCODER = EncoderConfig(
    hidden_size=16, depth=3, num_attn_head=2, num_mt_block=1, activation="PReLU", dropout=0.1,
    embedding_output_type="both",
)


def fixture_heads(mode: str) -> PretrainHeadsConfig:
    """Heads of the fixture checkpoints (README "Pretrain ckpts")."""
    return PretrainHeadsConfig(
        pretrain_mode=mode, atom_vocab_size=126, bond_vocab_size=101, smiles_vocab_size=41, latent_dim=16,
        decoder_num_layers=2, decoder_num_attention_heads=2, decoder_ffn_hidden_size=32, decoder_max_seq_len=64,
    )


def read_key_list(path: Path) -> list[tuple[str, ...]]:
    """(name, shape[, dtype]) rows of a keys_*.txt file, header comments skipped."""
    lines = path.read_text().splitlines()
    return [tuple(line.split("\t")) for line in lines if line and not line.startswith("#")]


def key_list(model: torch.nn.Module, with_dtype: bool) -> list[tuple[str, ...]]:
    rows = []
    for name, tensor in model.state_dict().items():
        row = (name, str(tuple(tensor.shape)))
        rows.append(row + (str(tensor.dtype).removeprefix("torch."),) if with_dtype else row)
    return rows


@pytest.fixture(scope="module")
def outputs() -> dict[str, np.ndarray]:
    return upstream_outputs()


@pytest.fixture(scope="module")
def graph() -> BatchMolGraph:
    return fixture_batch()


@pytest.fixture(scope="module")
def batch(graph, outputs) -> PretrainBatch:
    targets = VocabTargets(
        atom=torch.from_numpy(outputs["pt_av_labels_all"]),
        bond=torch.from_numpy(outputs["pt_bv_labels_all"]),
        fg=torch.from_numpy(outputs["pt_fg_labels"]),
    )
    return PretrainBatch(graph=graph, vocab_targets=targets, tokens=torch.from_numpy(outputs["pt_hybrid_dec_tokens"]))


def load_fixture_model(mode: str) -> KermtPretrainModel:
    model = KermtPretrainModel(FIXTURE_ENCODER, fixture_heads(mode))
    state = torch.load(FIXTURE_DIR / f"ckpt_pretrain_{mode}.pt", weights_only=False)["state_dict"]
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def models() -> dict[str, KermtPretrainModel]:
    return {mode: load_fixture_model(mode) for mode in ("vocab", "hybrid")}


@pytest.fixture(scope="module")
def predictions(models, batch):
    with torch.no_grad():
        return {mode: model(batch, sample_latent=False) for mode, model in models.items()}


@pytest.mark.parametrize("mode", ["vocab", "hybrid"])
def test_state_dict_layout_equals_upstream(mode: str) -> None:
    model = KermtPretrainModel(FIXTURE_ENCODER, fixture_heads(mode))
    assert key_list(model, with_dtype=True) == read_key_list(FIXTURE_DIR / f"keys_ckpt_pretrain_{mode}.txt")


def test_hybrid_shares_one_encoder(models) -> None:
    hybrid = models["hybrid"]
    assert hybrid.latent_dist.kermt is hybrid.kermt
    state_tensors = len(hybrid.state_dict())
    unique = len(dict(hybrid.named_parameters())) + len(dict(hybrid.named_buffers()))
    assert state_tensors == 241 and unique < state_tensors  # the encoder is listed twice, stored once


@pytest.mark.parametrize("mode", ["vocab", "hybrid"])
def test_vocab_heads_match_upstream(mode, predictions, outputs) -> None:
    preds = predictions[mode].vocab
    for ours, key in (
        (preds.atom_from_atom, "av_from_atom"), (preds.atom_from_bond, "av_from_bond"),
        (preds.bond_from_atom, "bv_from_atom"), (preds.bond_from_bond, "bv_from_bond"),
        (preds.fg_atom_from_atom, "fg_atom_from_atom"), (preds.fg_atom_from_bond, "fg_atom_from_bond"),
        (preds.fg_bond_from_atom, "fg_bond_from_atom"), (preds.fg_bond_from_bond, "fg_bond_from_bond"),
    ):
        np.testing.assert_allclose(ours.numpy(), outputs[f"pt_{mode}_{key}"], **TOL, err_msg=key)


@pytest.mark.parametrize("mode", ["vocab", "hybrid"])
def test_vocab_loss_matches_upstream(mode, predictions, batch, outputs) -> None:
    loss = vocab_loss(predictions[mode].vocab, batch.vocab_targets, dist_coff=0.1)
    key = "pt_vocab_loss_all_labels" if mode == "vocab" else "pt_hybrid_vocab_loss_all_labels"
    np.testing.assert_allclose(torch.stack(loss.as_tuple()).numpy(), outputs[key], **TOL)


def test_latent_head_matches_upstream(models, predictions, graph, outputs) -> None:
    hybrid = models["hybrid"]
    with torch.no_grad():
        pooled = hybrid.latent_dist.pooled_families(hybrid.kermt(graph), graph)
    for short, name in (("aa", "atom_from_atom"), ("ab", "atom_from_bond"), ("ba", "bond_from_atom"),
                        ("bb", "bond_from_bond")):
        np.testing.assert_allclose(pooled[name].numpy(), outputs[f"pt_hybrid_latent_readout_{short}"], **TOL)
    latent = predictions["hybrid"].latent
    np.testing.assert_allclose(latent.mean.numpy(), outputs["pt_hybrid_latent_mean"], **TOL)
    np.testing.assert_allclose(latent.log_scale.numpy(), outputs["pt_hybrid_latent_log_scale"], **TOL)


def test_decoder_and_cmim_terms_match_upstream(predictions, outputs) -> None:
    out = predictions["hybrid"]
    np.testing.assert_array_equal(out.teacher.padding_mask.numpy(), outputs["pt_hybrid_dec_padding_mask"])
    np.testing.assert_allclose(out.decoder_logits.numpy(), outputs["pt_hybrid_dec_logits_memory_eq_mean"], **TOL)
    terms = cmim_terms(out.latent, out.z, temperature=0.1)
    for ours, key in ((terms.cmim, "cmim_loss"), (terms.log_p_k1_given_zx, "log_p_k1_given_zx"),
                      (terms.log_q_z_given_x, "log_q_z_given_x"), (terms.log_P_z, "log_P_z")):
        np.testing.assert_allclose(ours.numpy(), outputs[f"pt_hybrid_{key}_z_eq_mean"], **TOL, err_msg=key)
    recon = reconstruction_terms(out.decoder_logits, out.teacher.targets, out.teacher.padding_mask)
    np.testing.assert_allclose(recon.loss.mean().item(), outputs["pt_hybrid_recon_loss_z_eq_mean"], **TOL)
    np.testing.assert_allclose(recon.accuracy.mean().item(), outputs["pt_hybrid_recon_acc_z_eq_mean"], **TOL)


def test_hybrid_total_loss_combines_upstream_components(models, predictions, batch, outputs) -> None:
    heads, config = fixture_heads("hybrid"), PretrainLossConfig(dist_coff=0.1, vocab_loss_weight=0.5)
    loss = pretrain_loss(predictions["hybrid"], batch, heads, config)
    cmim_total = outputs["pt_hybrid_cmim_loss_z_eq_mean"].mean() + outputs["pt_hybrid_recon_loss_z_eq_mean"]
    expected = cmim_total + 0.5 * outputs["pt_hybrid_vocab_loss_all_labels"][0]
    np.testing.assert_allclose(loss.total.item(), expected, rtol=1e-6)
    scalars = loss.scalars()
    assert scalars["vocab_loss"] == pytest.approx(float(outputs["pt_hybrid_vocab_loss_all_labels"][0]), rel=1e-6)
    assert {"loss", "av_loss", "fg_dist_loss", "cmim_total", "recon_accuracy", "log_P_z"} <= set(scalars)


def test_single_encoder_pass_gives_the_same_eval_numbers(models, batch, predictions) -> None:
    heads = replace(fixture_heads("hybrid"), hybrid_single_encoder_pass=True)
    single = KermtPretrainModel(FIXTURE_ENCODER, heads)
    single.load_state_dict(models["hybrid"].state_dict())
    with torch.no_grad():
        out = single.eval()(batch, sample_latent=False)
    torch.testing.assert_close(out.decoder_logits, predictions["hybrid"].decoder_logits)


@pytest.mark.parametrize("mode,ckpt", [("vocab", "ckpt_pretrain_vocab"), ("hybrid", "ckpt_pretrain_hybrid"),
                                       ("ft_reg", "ckpt_ft_reg")])
def test_fingerprints_match_upstream(mode, ckpt, graph, outputs) -> None:
    state = torch.load(FIXTURE_DIR / f"{ckpt}.pt", weights_only=False)["state_dict"]
    fingerprinter = KermtFingerprint(KermtEmbedding(FIXTURE_ENCODER), source="both")
    fingerprinter.kermt.load_state_dict(encoder_state(state), strict=True)
    with torch.no_grad():
        fp = fingerprinter.eval()(graph)
    key = "ft_reg_fingerprint_both" if mode == "ft_reg" else f"pt_{mode}_fingerprint_both"
    np.testing.assert_allclose(fp.numpy(), outputs[key], **TOL)


@pytest.mark.parametrize("latent_dim", [512, 800])
def test_full_size_hybrid_layout_on_meta_device(latent_dim: int) -> None:
    path = FIXTURE_DIR / f"keys_full_hybrid70m_latent{latent_dim}.txt"
    header = path.read_text().splitlines()[1]
    encoder = EncoderConfig(hidden_size=800, depth=6, num_attn_head=4, num_mt_block=1, activation="PReLU",
                            embedding_output_type="both")
    heads = PretrainHeadsConfig(  # vocab sizes: the placeholders named in the file's header
        pretrain_mode="hybrid", atom_vocab_size=311, bond_vocab_size=539, smiles_vocab_size=41, latent_dim=latent_dim,
    )
    with torch.device("meta"):
        model = KermtPretrainModel(encoder, heads)
    assert key_list(model, with_dtype=False) == read_key_list(path)
    n_params = sum(p.numel() for p in model.parameters())
    assert f"{n_params:,}" in header


@pytest.mark.parametrize("mode", ["vocab", "hybrid"])
def test_model_rebuilt_from_checkpoint_settings_loads_strictly(mode: str) -> None:
    ckpt = read_checkpoint(FIXTURE_DIR / f"ckpt_pretrain_{mode}.pt")  # safe reader: no pickled code runs
    heads, loss = configs_from_settings(ckpt.spec.pretrain)
    vocab_only = PretrainHeadsConfig(pretrain_mode="vocab", atom_vocab_size=126, bond_vocab_size=101)
    assert heads == (fixture_heads(mode) if mode == "hybrid" else vocab_only)
    assert loss == PretrainLossConfig()
    model = KermtPretrainModel(ckpt.spec.encoder, heads)
    model.load_state_dict(ckpt.state_dict, strict=True)
