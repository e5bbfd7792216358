"""Record upstream KERMT's outputs and gradients for architecture options the other oracles do not cover (bias,
several MT blocks, activations other than PReLU, mean readout, task-specific FFN layers); see README.md here. Needs
an upstream checkout at the fixtures' commit; run from the repository root:

    .venv/bin/python tests/data/kermt_upstream_arch/record.py --upstream /path/to/KERMT

Only upstream's code runs here (imported as ../kermt_upstream_pretrain/record.py imports it); our ``kermt`` is never
imported (both packages are called ``kermt``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FIXTURES = ROOT / "tests/data/kermt_upstream"
sys.path.insert(0, str(ROOT))

from tests.data.kermt_upstream_arch import weights  # noqa: E402 - needs the root on sys.path; torch only: safe before upstream's import

sys.path.remove(str(ROOT))


def _pretrain_recorder():
    """../kermt_upstream_pretrain/record.py as a module: its upstream import, fixture SMILES and depth recorder."""
    spec = importlib.util.spec_from_file_location("pretrain_record", HERE.parent / "kermt_upstream_pretrain/record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PRETRAIN = _pretrain_recorder()
GRAPH_FIELDS = ("f_atoms", "f_bonds", "a2b", "b2a", "b2revb", "a_scope", "b_scope", "a2a")  # upstream's order

# A finetuned regression model on 2 tasks, saved with the fixture checkpoint's args (a real upstream finetune run's)
# made tiny: hidden 8 keeps every gradient of several cases in a small file (most parameters sit in the encoder's
# (hidden + 151)-wide output FFNs). Dropout 0: a train step is deterministic apart from the dynamic-depth draws.
FINETUNE_BASE = dict(
    hidden_size=8, depth=3, num_attn_head=2, num_mt_block=1, activation="PReLU", bias=False, dropout=0.0,
    self_attention=True, attn_hidden=4, attn_out=2, ffn_hidden_size=6, ffn_num_layers=2,
    ffn_num_task_specific_layers=0, ffn_task_specific_hidden_size=None, features_generator=None,
    features_size=0, features_scaling=False, use_input_features=None, embedding_output_type="atom", cuda=False,
    num_tasks=2, dataset_type="regression", task_names=["t1", "t2"],
)
FEATURES = dict(features_generator=["rdkit_2d_normalized"], use_input_features=["rdkit_2d_normalized"],
                features_size=200)  # the fixture's upstream-computed rdkit_2d_normalized rows (outputs.npz)
# case -> (train-step seed, architecture settings over FINETUNE_BASE)
FINETUNE_CASES = {
    "bias": (3, dict(bias=True)),
    "blocks2_mean_ffn3": (5, dict(num_mt_block=2, self_attention=False, ffn_num_layers=3)),
    "bias_blocks2_elu_features": (7, dict(bias=True, num_mt_block=2, activation="ELU", **FEATURES)),
    "elu_mean_task_specific2": (11, dict(activation="ELU", self_attention=False, ffn_num_task_specific_layers=2,
                                         ffn_task_specific_hidden_size=6)),
    "bias_blocks2_task_specific1_depth2": (13, dict(bias=True, num_mt_block=2, depth=2, ffn_num_task_specific_layers=1,
                                                    ffn_task_specific_hidden_size=6)),
    "relu": (17, dict(activation="ReLU")),
    "leakyrelu_bias": (19, dict(activation="LeakyReLU", bias=True)),
    "selu_mean": (23, dict(activation="SELU", self_attention=False)),
    "tanh_blocks2": (29, dict(activation="tanh", num_mt_block=2)),
}
DATA_SCALER = {"means": [0.25, -1.5], "stds": [2.0, 0.5]}  # saved with the model as upstream saves it; unused here
DROPOUT = 0.1  # the second train step's: upstream's per-encoder loop and its order of dropout draws
LOSS_WEIGHT_A = 0.5  # train step loss: LOSS_WEIGHT_A * sum(atom_view**2) + sum(bond_view**2)

# A vocab-mode pretraining model (upstream's KermtTask) with bias and 2 MT blocks. Small vocabularies keep the head
# outputs small: vocab and functional-group sizes only set head widths, and eval-mode outputs need no labels.
PRETRAIN_CASE = dict(atom_vocab_size=6, bond_vocab_size=5, fg_size=12,
                     args=dict(hidden_size=8, depth=3, num_attn_head=2, num_mt_block=2, activation="PReLU",
                               bias=True, dropout=0.0, embedding_output_type="both", pretrain_mode="vocab"))


def fixture_graph() -> tuple:
    """Upstream's mol2graph on the fixture SMILES (RDKit featurisation, no bond dropout); checked equal to
    graph.npz, the batch the tests read."""
    from kermt.data.molgraph import mol2graph

    settings = Namespace(use_cuikmolmaker_featurization=False, bond_drop_rate=0, no_cache=True)
    components = mol2graph(PRETRAIN.fixture_smiles(), {}, settings).get_components()
    with np.load(FIXTURES / "graph.npz") as stored:
        for name, tensor in zip(GRAPH_FIELDS, components):
            assert np.array_equal(np.asarray(tensor), stored[f"batch_{name}"]), name
    return components


def fixture_features() -> list[np.ndarray]:
    with np.load(FIXTURES / "outputs.npz") as stored:
        return list(stored["ft_reg_features_batch"])


def load_keyed_weights(model: torch.nn.Module, case: str) -> dict:
    """Give ``model`` the keyed weights of ``case`` (weights.py); returns the layout that regenerates them and the
    digest of the weights loaded."""
    params = {p.data_ptr() for p in model.parameters()}
    first_key: dict[int, str] = {}
    layout = []
    for key, tensor in model.state_dict().items():
        if tensor.data_ptr() not in params:  # a buffer (the readouts' cached zero vector)
            assert not tensor.any(), key
            layout.append([key, list(tensor.shape), None])
        else:
            layout.append([key, list(tensor.shape), first_key.setdefault(tensor.data_ptr(), key)])
    model.load_state_dict(weights.state_dict(case, layout), strict=True)
    return {"layout": layout, "digest": weights.digest(model.state_dict())}


def saved_checkpoint(model, args: Namespace, scratch: Path) -> dict:
    """The model as upstream's save_checkpoint writes it, read back (upstream's own file)."""
    from kermt.data.scaler import StandardScaler
    from kermt.util.utils import save_checkpoint

    scaler = StandardScaler(np.array(DATA_SCALER["means"]), np.array(DATA_SCALER["stds"]))
    path = scratch / "model.pt"
    save_checkpoint(str(path), model, scaler, None, args)
    return torch.load(path, map_location="cpu", weights_only=False)


def case_args(settings: dict, dropout: float = 0.0) -> Namespace:
    """The fixture finetune checkpoint's saved args with FINETUNE_BASE and the case's settings over them."""
    base = torch.load(FIXTURES / "ckpt_ft_reg.pt", map_location="cpu", weights_only=False)["args"]
    return Namespace(**{**vars(base), **FINETUNE_BASE, **settings, "dropout": dropout})


def seeded_train_forward(model, graph: tuple, features: list, seed: int) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Upstream's train-mode forward after seeding numpy (dynamic depths) and torch (dropout masks) with ``seed``:
    (atom view, bond view, the depths drawn in draw order)."""
    from kermt.model import layers

    recorder, real_stats = PRETRAIN.DepthRecorder(layers.stats), layers.stats
    layers.stats = recorder
    try:
        np.random.seed(seed)
        torch.manual_seed(seed)
        atom_view, bond_view = model.train()(graph, features)
    finally:
        layers.stats = real_stats
    return atom_view, bond_view, recorder.depths


def finetune_case(name: str, step_seed: int, settings: dict, scratch: Path) -> dict:
    """Upstream's build_model, keyed weights, save_checkpoint; eval-mode prediction; one seeded train step with
    dropout 0 (views, every gradient) and one with dropout DROPOUT (views)."""
    from kermt.util.utils import build_model

    args = case_args(settings)
    model = build_model(args)  # adds output_size to args, which upstream saves
    checkpoint = load_keyed_weights(model, name)
    saved = saved_checkpoint(model, args, scratch)
    assert weights.digest(saved["state_dict"]) == checkpoint["digest"]
    checkpoint.update(args=vars(saved["args"]), data_scaler={k: v.tolist() for k, v in saved["data_scaler"].items()})
    graph = fixture_graph()
    features = fixture_features() if args.features_size else [None] * len(graph[5])
    out = {f"{name}::checkpoint": np.array(json.dumps(checkpoint))}
    with torch.no_grad():
        out[f"{name}::prediction"] = model.eval()(graph, features).numpy()
    atom_view, bond_view, depths = seeded_train_forward(model, graph, features, step_seed)
    (LOSS_WEIGHT_A * atom_view.square().sum() + bond_view.square().sum()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    out[f"{name}::step"] = np.array(json.dumps({
        "seed": step_seed, "dropout": DROPOUT, "grads": [[n, list(g.shape)] for n, g in grads.items()]}))
    out[f"{name}::depths"] = np.array(depths)
    out[f"{name}::atom_view"] = atom_view.detach().numpy()
    out[f"{name}::bond_view"] = bond_view.detach().numpy()
    out[f"{name}::grads"] = torch.cat([g.flatten() for g in grads.values()]).numpy()
    with_dropout = build_model(case_args(settings, DROPOUT))
    with_dropout.load_state_dict(saved["state_dict"])
    with torch.no_grad():
        views = seeded_train_forward(with_dropout, graph, features, step_seed)[:2]
    out[f"{name}::dropout_views"] = torch.stack(views).numpy()
    return out


def pretrain_case() -> dict:
    """Upstream's KermtTask (vocab mode) with bias and 2 MT blocks, keyed weights: eval-mode outputs of every
    vocab head."""
    from kermt.model.models import KERMTEmbedding, KermtTask

    case = PRETRAIN_CASE
    args = Namespace(**{**PRETRAIN.OPTIM_MODEL, "parser_name": "pretrain", **case["args"]})
    model = KermtTask(args, KERMTEmbedding(args), case["atom_vocab_size"], case["bond_vocab_size"], case["fg_size"])
    checkpoint = {**load_keyed_weights(model, "vocab"), "args": vars(args)}
    model.eval()
    with torch.no_grad():
        preds = model(fixture_graph())
    out = {"vocab::checkpoint": np.array(json.dumps(checkpoint))}
    for task, prefix in (("av_task", "av"), ("bv_task", "bv")):
        out[f"vocab::{prefix}_from_atom"] = preds[task][0].numpy()
        out[f"vocab::{prefix}_from_bond"] = preds[task][1].numpy()
    for key, value in preds["fg_task"].items():
        out[f"vocab::fg_{key}"] = value.numpy()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=Path, required=True)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        PRETRAIN.import_upstream(opts.upstream.resolve(), Path(scratch))
        record = {"loss_weight_a": np.float64(LOSS_WEIGHT_A), "cases": np.array(list(FINETUNE_CASES))}
        for name, (step_seed, settings) in FINETUNE_CASES.items():
            record.update(finetune_case(name, step_seed, settings, Path(scratch)))
        record.update(pretrain_case())
    np.savez_compressed(HERE / "arch_outputs.npz", **record)
    print(f"wrote {len(record)} arrays to {HERE / 'arch_outputs.npz'}")


if __name__ == "__main__":
    main()
