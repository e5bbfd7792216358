"""Record a few Adam steps of upstream KERMT's own finetune training loop on the fixture batch (the multi-step
oracle of tests/kermt/test_trajectory_parity.py). Needs an upstream checkout; run from the repository root:

    .venv/bin/python tests/data/kermt_upstream_train/record_trajectory.py --upstream /path/to/KERMT

The model is built as record.py builds it (upstream's ``build_model`` from ``ckpt_ft_reg.pt``'s saved args: depth
3, so a dynamic-depth draw often gives an encoder no iteration; atom embedding outputs; its weights), once with
dropout 0 and once with dropout ``DROPOUT``. Fixed regression targets (two missing) for the 26 molecules. Seeded
once (numpy's global RNG: dynamic depths; torch's: dropout masks), then ``STEPS`` steps exactly as upstream's
``task/train.py`` takes them on one process: zero_grad, forward, ``loss_func(preds, targets) * mask`` summed over
the labels and divided by their count, backward, ``torch.optim.Adam(lr=LR)`` step. Saved: per step the loss and
the names of the parameters that had no gradient; every parameter after the last step.
"""

from __future__ import annotations

import argparse
import json
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from tests.kermt.nn.upstream_fixtures import fixture_batch, outputs  # noqa: E402 - the root is put on sys.path above
from train_step import import_upstream_build_model  # noqa: E402 - and bench/ too

sys.path.remove(str(ROOT))  # upstream's ``kermt`` is a namespace package: ours would win (see record.py)

CHECKPOINT = ROOT / "tests/data/kermt_upstream/ckpt_ft_reg.pt"
OUTPUT = Path(__file__).with_name("trajectory.npz")
CASES = {"dropout0": 0.0, "dropout02": 0.2}
SEED = 5
STEPS = 6
LR = 1e-3
MISSING = ((3, 0), (17, 1))  # (molecule, task) without a label


def fixed_targets() -> np.ndarray:
    """[26, 2] float32 regression targets, NaN where MISSING (the test rebuilds the same array)."""
    targets = np.random.default_rng(2024).normal(size=(26, 2)).astype(np.float32)
    for row, task in MISSING:
        targets[row, task] = np.nan
    return targets


def record_case(upstream: Path, dropout: float, checkpoint: dict) -> dict[str, np.ndarray]:
    args = Namespace(**{**vars(checkpoint["args"]), "dropout": dropout, "embedding_output_type": "atom",
                        "cuda": False})
    model = import_upstream_build_model(upstream)(args)
    model.load_state_dict(checkpoint["state_dict"])
    model.train()
    loss_func = type(model).get_loss_func(args)
    graph, features = fixture_batch(), list(outputs()["ft_reg_features_batch"])
    raw = torch.from_numpy(fixed_targets())
    mask, targets = (~torch.isnan(raw)).float(), torch.nan_to_num(raw)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    record: dict[str, np.ndarray] = {}
    for step in range(STEPS):
        optimizer.zero_grad()
        preds = model(graph.components(), features)
        loss = (loss_func(preds, targets) * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        record[f"step{step}::loss"] = np.float64(loss.item())
        no_grad = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
        record[f"step{step}::no_grad"] = np.array(json.dumps(no_grad))
    for name, param in model.named_parameters():
        record[f"final::{name}"] = param.detach().numpy().copy()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", type=Path, required=True)
    opts = parser.parse_args()
    checkpoint = torch.load(CHECKPOINT, map_location="cpu", weights_only=False)  # upstream's own test fixture
    settings = {"seed": SEED, "steps": STEPS, "lr": LR, "missing": MISSING,
                "dist_coff": float(checkpoint["args"].dist_coff), "cases": CASES}
    record = {"targets": fixed_targets(), "settings": np.array(json.dumps(settings))}
    for case, dropout in CASES.items():
        recorded = record_case(opts.upstream, dropout, checkpoint)
        record.update({f"{case}::{key}": value for key, value in recorded.items()})
    np.savez_compressed(OUTPUT, **record)
    print(f"wrote {len(record)} arrays to {OUTPUT}")


if __name__ == "__main__":
    main()
