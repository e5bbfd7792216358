"""MolPAL's retrospective docking benchmark for `kermt explore`: how much of the true top 1 % each strategy finds.

The data: the public repository coleygroup/molpal (MIT), ``data/Enamine10k_scores.csv.gz`` (10,449 molecules with
AutoDock Vina scores against a thymidylate kinase, lower is better). Its protocol: a 1 % random first batch, then 5
rounds of 1 %; after each round, the share of the library's true top 1 % (by score) among the molecules explored.

Strategies, each from the same random first batch (the same --seed):

- ``random``, ``greedy``, ``ucb``: `kermt explore` with a lookup objective on the file itself (--minimize), run one
  round at a time (the same command with --iterations k resumes), so each round's wall time is measured;
- ``rf``: MolPAL's default model family, a random forest (scikit-learn, 100 trees) on 2048-bit Morgan
  fingerprints (radius 2), greedy, in this process.

    .venv/bin/python bench/explore.py --scores Enamine10k_scores.csv.gz --save_dir runs/bench_explore

Prints one table: per strategy and round, the share of the top 1 % found and the round's wall time. Extra flags
after ``--`` go to every `kermt explore` (the surrogate's finetune flags, ``--warm_start``). ``--ucb_uncertainty
mve`` gives ucb one mean-variance model instead of an ensemble of 3. Round 1's time includes featurising the
library once (DIR/library/), which later rounds read. Figures: docs/explore.md#measured.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # a loaded machine: OpenMP's spinning threads cost more than they give

import numpy as np

from kermt.explore.acquisition import random_batch, round_rng, top_batch
from kermt.explore.explored import read_explored
from kermt.explore.sizes import parse_size

ROUNDS, SHARE = 5, "0.01"
# the surrogate: the small fixture encoder with RDKit's normalised 2D descriptors (as jobs/configs/demo.yaml), the
# settings that learned the demo's logP from 200 molecules (r 0.86 on the rest of the library, docs/explore.md)
ROOT = Path(__file__).resolve().parents[1]
# ucb's surrogate uncertainty (--ucb_uncertainty): an ensemble's spread (three finetunes a round) or one model's
# mean-variance head (one finetune a round, as greedy's)
UNCERTAINTY = {"ensemble": ["--ensemble_size", "3"], "mve": ["--loss", "mve"]}
SURROGATE = ["--checkpoint_path", str(ROOT / "tests" / "data" / "kermt_upstream" / "ckpt_pretrain_vocab.pt"),
             "--epochs", "30", "--batch_size", "32", "--features_generator", "rdkit_2d_normalized",
             "--no_features_scaling", "--max_lr", "0.002", "--final_lr", "0.0002", "--warmup_epochs", "1",
             "--ffn_hidden_size", "32"]


def read_scores(path: str) -> tuple[list[str], np.ndarray]:
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(path)
    return table.column("smiles").to_pylist(), table.column("score").to_numpy().astype(np.float64)


def top_share(found_rows: np.ndarray, top: set[int]) -> float:
    return len(top.intersection(found_rows.tolist())) / len(top)


def run_kermt(strategy: str, scores_path: str, save_dir: Path, seed: int, extra: list[str],
              uncertainty: str = "ensemble") -> list[tuple[float, float]]:
    """(top-1 % share, seconds) after each round of `kermt explore --acquisition strategy`."""
    from ray_app.cli import main

    top = true_top(read_scores(scores_path)[1])
    flags = ["explore", "--library", scores_path, "--objective", f"lookup:{scores_path}:score", "--minimize",
             "--init_size", SHARE, "--acquire_size", SHARE, "--acquisition", strategy, "--seed", str(seed),
             "--save_dir", str(save_dir / strategy), *(UNCERTAINTY[uncertainty] if strategy == "ucb" else []),
             *SURROGATE, *extra]
    results = []
    for k in range(1, ROUNDS + 1):  # the same command with --iterations k resumes after round k - 1
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            status = main([*flags, "--iterations", str(k)])
        seconds = time.perf_counter() - started
        if status:
            raise SystemExit(f"kermt explore --acquisition {strategy} failed (status {status})")
        explored = read_explored(str(save_dir / strategy / "explored.csv"))
        if k == 1:  # round 0 ran in round 1's command, timed with it
            results.append((top_share(explored.library_row[explored.round == 0], top), float("nan")))
        results.append((top_share(explored.library_row, top), seconds))
    return results


def true_top(scores: np.ndarray) -> set[int]:
    """The rows of the best 1 % of scores (lowest)."""
    count = parse_size(SHARE, "top").molecules(len(scores))
    return set(np.argsort(scores, kind="stable")[:count].tolist())


def run_forest(scores_path: str, seed: int) -> list[tuple[float, float]]:
    """MolPAL's baseline: random forest on Morgan fingerprints, greedy, from the same first batch."""
    from rdkit import Chem
    from rdkit.Chem import rdFingerprintGenerator
    from sklearn.ensemble import RandomForestRegressor

    smiles, scores = read_scores(scores_path)
    top = true_top(scores)
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    features = np.stack([generator.GetFingerprintAsNumPy(Chem.MolFromSmiles(s)) for s in smiles]).astype(np.uint8)
    size = parse_size(SHARE, "--acquire_size").molecules(len(smiles))
    explored = np.zeros(len(smiles), dtype=bool)
    started = time.perf_counter()
    explored[random_batch(explored, size, round_rng(seed, 0))] = True
    results = [(top_share(np.flatnonzero(explored), top), time.perf_counter() - started)]
    for _ in range(ROUNDS):
        started = time.perf_counter()
        forest = RandomForestRegressor(n_estimators=100, n_jobs=1, random_state=seed)
        forest.fit(features[explored], scores[explored])
        explored[top_batch(-forest.predict(features), explored, size)] = True  # lower is better
        results.append((top_share(np.flatnonzero(explored), top), time.perf_counter() - started))
    return results


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    ours, extra = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", required=True, help="MolPAL's data/Enamine10k_scores.csv.gz")
    parser.add_argument("--save_dir", default="runs/bench_explore")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategies", default="random,rf,greedy,ucb")
    parser.add_argument("--ucb_uncertainty", choices=tuple(UNCERTAINTY), default="ensemble",
                        help="ucb's surrogate: an ensemble of 3 or one mean-variance (mve) model")
    args = parser.parse_args(ours)
    table = {}
    for strategy in args.strategies.split(","):
        if strategy == "rf":
            table[strategy] = run_forest(args.scores, args.seed)
        else:
            table[strategy] = run_kermt(strategy, args.scores, Path(args.save_dir), args.seed, extra,
                                        args.ucb_uncertainty)
        print(f"{strategy}: " + "  ".join(f"r{k} {share:.3f} ({seconds:.0f} s)"
                                          for k, (share, seconds) in enumerate(table[strategy])), flush=True)
    print("\nshare of the true top 1 % found after each round (1 % random start, 5 rounds of 1 %)")
    print("strategy  " + "  ".join(f"round {k}" for k in range(ROUNDS + 1)))
    for strategy, results in table.items():
        print(f"{strategy:9s} " + "  ".join(f"{share:7.3f}" for share, _ in results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
