"""Record upstream KERMT's train-mode outputs and gradients on the fixture batch (the parity oracle of
tests/kermt/nn/test_train_mode_parity.py). Needs an upstream checkout; run from the repository root:

    .venv/bin/python tests/data/kermt_upstream_train/record.py --upstream /path/to/KERMT

Upstream's own ``build_model`` builds the finetune model from ``ckpt_ft_reg.pt``'s saved args with
``embedding_output_type="atom"`` (upstream's finetune default; a checkpoint saved with "both" makes upstream also run
the bond branches, whose dropout draws shift every later mask) and dropout ``DROPOUT``, and loads the checkpoint's
weights. For each seed: numpy's global RNG (dynamic depths) and torch's RNG (dropout) are seeded, one forward in
train mode on the 26-molecule fixture batch with its rdkit_2d_normalized features, then the backward of
``LOSS_WEIGHT_A * sum(atom_view**2) + sum(bond_view**2)``. Saved: both views, every parameter's gradient and the
settings (``dropout``, ``seeds``, ``loss_weight_a``).
"""

from __future__ import annotations

import argparse
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from tests.kermt.nn.upstream_fixtures import fixture_batch, outputs  # noqa: E402 - the root is put on sys.path above
from train_step import import_upstream_build_model  # noqa: E402 - and bench/ too

# Upstream's ``kermt`` is a namespace package: with the repository root on sys.path our regular package would win.
sys.path.remove(str(ROOT))

CHECKPOINT = ROOT / "tests/data/kermt_upstream/ckpt_ft_reg.pt"
OUTPUT = Path(__file__).with_name("train_mode_outputs.npz")
DROPOUT = 0.2
SEEDS = (3, 11)
LOSS_WEIGHT_A = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=Path, required=True)
    opts = parser.parse_args()
    checkpoint = torch.load(CHECKPOINT, map_location="cpu", weights_only=False)  # upstream's own test fixture
    args = Namespace(**{**vars(checkpoint["args"]), "dropout": DROPOUT, "embedding_output_type": "atom",
                        "cuda": False})
    model = import_upstream_build_model(opts.upstream)(args)
    model.load_state_dict(checkpoint["state_dict"])
    model.train()
    graph, features = fixture_batch(), list(outputs()["ft_reg_features_batch"])
    # the settings travel with the oracle, so the test reads them instead of repeating them
    record = {"dropout": np.float64(DROPOUT), "seeds": np.array(SEEDS), "loss_weight_a": np.float64(LOSS_WEIGHT_A)}
    for seed in SEEDS:
        np.random.seed(seed)
        torch.manual_seed(seed)
        model.zero_grad(set_to_none=True)
        atom_view, bond_view = model(graph.components(), features)
        (LOSS_WEIGHT_A * atom_view.square().sum() + bond_view.square().sum()).backward()
        record[f"seed{seed}_atom_view"] = atom_view.detach().numpy()
        record[f"seed{seed}_bond_view"] = bond_view.detach().numpy()
        for name, param in model.named_parameters():
            if param.grad is not None:
                record[f"seed{seed}_grad::{name}"] = param.grad.numpy().copy()
    np.savez_compressed(OUTPUT, **record)
    print(f"wrote {len(record)} arrays to {OUTPUT}")


if __name__ == "__main__":
    main()
