"""Per-atom attributions against known truth: which method finds the atoms a model's number comes from (issue 39).

    .venv/bin/python bench/attributions.py [--work runs/bench_attributions] [--epochs 30] [--test 200]
                                           [--methods ig32 ig16 ...]

Two from-scratch models (zero padding, no molecule descriptors, a small architecture so that both train in a few
minutes on 2 shared cores; cached under ``--work`` and reused while their settings stay the same), on
data/sample/admet_demo.csv's molecules (the last ``--test`` held out):

* ``logp``: the file's column, RDKit's Crippen logP, which is a sum of per-atom contributions
  (``rdMolDescriptors._CalcCrippenContribs`` on the molecule with explicit hydrogens, each hydrogen's folded onto
  its heavy atom). A model that learnt it should attribute as Crippen does: scored by the mean over held-out
  molecules of the Pearson correlation between a method's atom values and those contributions.
* ``halogens``: a synthetic count, the number of F, Cl, Br and I atoms. Scored on held-out molecules with a halogen
  by the share of attribution mass (sum of |values|) on the halogen atoms, and the Pearson correlation with the
  halogen indicator.

Methods (kermt.inference.attributions unless said): ``igN``, integrated gradients from the reference atom and
bond (kermt.inference.reference_atom) over N equal steps, the shipped method (ig16 by default); ``ig16_atoms``, the
same with the bonds' own features kept (only atom rows on the path); ``ig32_empty``, from the all-zero input with 32
points spaced evenly in log(alpha); ``gradxinput``, the gradient at the molecule times (input - reference);
``occlusion`` (here), each atom's prediction minus the prediction with that atom's features zeroed (not additive).
Residual: mean |sum of values - (prediction - baseline)| over mean |prediction - baseline| (0 for an exactly
additive method). Molecules/s: the held-out molecules over the method's wall time on this machine, one model, one
torch thread (``--threads``); per CPU-second: over the process's CPU time, which a shared machine's load changes
less. ``--chemprop PYTHON`` (chemprop 2.3.1's own environment) adds chemprop's Myerson values and its MCTS
rationales from a chemprop model trained on the same molecules (bench/chemprop_compare.py,
bench/chemprop_myerson.py), on the first ``--chemprop_limit`` held-out molecules, and each kermt method's scores
on those molecules alone beside its scores on all of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.chemprop_compare import chemprop_rows, run_chemprop
from kermt.checkpoint import CheckpointSpec, read_checkpoint, save_native
from kermt.config import EncoderConfig, FinetuneModelConfig, HeadConfig, ReadoutConfig
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import FeaturizedMolecules, featurize_smiles
from kermt.data.scalers import StandardScaler
from kermt.inference import Ensemble
from kermt.chem.features import ATOM_FDIM, BOND_ONLY_FDIM
from kermt.inference.attributions import Attributor, Baseline, PathRule
from kermt.nn.finetune import KermtFinetuneModel
from kermt.nn.heads import initialize_weights
from kermt.train.loop import MemberPlan, fit

DEMO = ROOT / "data/sample/admet_demo.csv"
HALOGENS = frozenset({9, 17, 35, 53})


@dataclasses.dataclass(frozen=True)
class TinySettings:
    """A from-scratch model small enough to train in minutes on 2 cores (the shipped preset is 800 wide)."""

    hidden_size: int = 64
    depth: int = 3
    num_attn_head: int = 2
    epochs: int = 30
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0


def tiny_config(settings: TinySettings, num_tasks: int = 1) -> FinetuneModelConfig:
    encoder = EncoderConfig(hidden_size=settings.hidden_size, depth=settings.depth,
                            num_attn_head=settings.num_attn_head, activation="ReLU", embedding_output_type="atom",
                            padding="zero")
    head = HeadConfig(num_tasks=num_tasks, dataset_type="regression", ffn_hidden_size=settings.hidden_size,
                      activation="ReLU")
    return FinetuneModelConfig(encoder, ReadoutConfig(), head)


def _molecule_set(molecules: FeaturizedMolecules, targets: np.ndarray) -> MoleculeSet:
    return MoleculeSet(molecules.graphs, None, targets.astype(np.float32), molecules.smiles)


def train_model(smiles: Sequence[str], targets: np.ndarray, task: str, directory: Path,
                settings: TinySettings = TinySettings(), log: Callable[[str], None] = print) -> Path:
    """A native checkpoint of a from-scratch regression model of ``targets`` [n] on ``smiles`` (every one valid),
    under ``directory``; reused when one trained with the same settings and data is there."""
    model_dir, record = directory / "model", directory / "settings.json"
    key = {"settings": dataclasses.asdict(settings), "task": task, "n": len(smiles),
           "targets": float(np.nansum(targets)), "first": smiles[0], "last": smiles[-1]}
    if record.is_file() and json.loads(record.read_text()) == key and model_dir.is_dir():
        return model_dir
    molecules = featurize_smiles(list(smiles))
    assert molecules.valid.all(), "train_model takes valid SMILES"
    labels = np.asarray(targets, dtype=np.float64).reshape(-1, 1)
    scaler = StandardScaler.fit(labels)
    order = np.random.default_rng(settings.seed).permutation(len(smiles))
    val_rows, train_rows = order[: len(order) // 10], order[len(order) // 10:]
    scaled = scaler.transform(labels)
    config = tiny_config(settings)
    torch.manual_seed(settings.seed)
    model = KermtFinetuneModel(config)
    for name, module in model.named_children():
        if name != "kermt":
            initialize_weights(module)
    plan = MemberPlan(
        model_config=config, initial_state=model.state_dict(),
        train=_molecule_set(molecules.select(train_rows), scaled[train_rows]),
        val=_molecule_set(molecules.select(val_rows), scaled[val_rows]), target_scaler=scaler, seed=settings.seed,
        epochs=settings.epochs, global_batch_size=settings.batch_size, init_lr=settings.lr / 10,
        max_lr=settings.lr, final_lr=settings.lr / 10, warmup_epochs=2.0, weight_decay=0.0, fine_tune_coff=1.0,
        dist_coff=0.1, bond_drop_rate=0.0, metric="rmse", select_by_loss=False, early_stop_epoch=1000,
        label=task, precision="fp32", dropout_draws="per_molecule")
    started = time.perf_counter()

    def progress(metrics: dict, _checkpoint) -> None:
        log(f"{task}: epoch {metrics['epoch']} val rmse {metrics['val_rmse']:.3f} "
            f"({time.perf_counter() - started:.0f} s)")

    member = fit(plan, epoch_done=progress)
    spec = CheckpointSpec.for_finetune_model(config, task_names=(task,), data_scaler=scaler)
    save_native(model_dir, member.best_model().state_dict(), spec)
    record.write_text(json.dumps(key))
    return model_dir


def ensemble_of(model_dir: Path) -> Ensemble:
    return Ensemble([read_checkpoint(model_dir)])


# ------------------------------------------------------------------------------------------------------ truth


def _molecule(smiles: str):
    from rdkit import Chem

    return Chem.MolFromSmiles(smiles)


def crippen_contributions(smiles: str) -> np.ndarray:
    """float64 [heavy atoms]: each heavy atom's Crippen logP contribution plus its hydrogens', in parse order."""
    from rdkit import Chem
    from rdkit.Chem import rdMolDescriptors

    mol = _molecule(smiles)
    with_h = Chem.AddHs(mol)  # heavy atoms keep their indices; hydrogens come after them
    contributions = np.array([logp for logp, _ in rdMolDescriptors._CalcCrippenContribs(with_h)])
    out = contributions[: mol.GetNumAtoms()].copy()
    for atom in list(with_h.GetAtoms())[mol.GetNumAtoms():]:
        out[atom.GetNeighbors()[0].GetIdx()] += contributions[atom.GetIdx()]
    return out


def halogen_mask(smiles: str) -> np.ndarray:
    """bool [heavy atoms]: which atoms are F, Cl, Br or I."""
    return np.array([atom.GetAtomicNum() in HALOGENS for atom in _molecule(smiles).GetAtoms()])


def halogen_counts(smiles: Sequence[str]) -> np.ndarray:
    return np.array([halogen_mask(s).sum() for s in smiles], dtype=np.float64)


# ---------------------------------------------------------------------------------------------------- methods


def occlusion(ensemble: Ensemble, molecules: FeaturizedMolecules, atoms_per_forward: int = 16_384) -> list:
    """Per valid row [heavy atoms, T]: the prediction minus the prediction with that atom's features zeroed (its
    feature row and the source part of its outgoing bonds; its bonds' own features kept). One forward holds each
    molecule and its one-atom-masked copies. Not additive."""
    from kermt.inference.batches import atom_budget_starts

    rows = np.flatnonzero(molecules.valid)
    counts = molecules.graphs.atom_counts.astype(np.int64)
    out: list = [None] * len(molecules)
    model = ensemble.models[0]
    scaler = ensemble.specs[0].data_scaler
    starts = atom_budget_starts(counts[rows] * (counts[rows] + 1), len(rows), atoms_per_forward)
    for start, stop in zip(starts, starts[1:] + [len(rows)]):
        chunk = rows[start:stop]
        copies = np.repeat(chunk, counts[chunk] + 1)  # each molecule, then it with atom k masked, k = 0, 1, ...
        graph = molecules.select(copies).batch_graph(None, 1)
        masked = torch.zeros(graph.f_atoms.shape[0], dtype=torch.bool)
        first = graph.a_scope[:, 0].numpy()
        position = np.concatenate([np.arange(-1, counts[r]) for r in chunk])  # -1: the unmasked copy
        masked[torch.from_numpy(first[position >= 0] + position[position >= 0])] = True
        f_atoms = graph.f_atoms.masked_fill(masked[:, None], 0.0)
        f_bonds = torch.cat([f_atoms[graph.b2a], graph.f_bonds[:, ATOM_FDIM:]], dim=1)
        with torch.no_grad():
            output = model(dataclasses.replace(graph, f_atoms=f_atoms, f_bonds=f_bonds), None)
        values = ((output.atom_view + output.bond_view) / 2).double().numpy() * scaler.stds
        bounds = np.cumsum(np.concatenate([[0], counts[chunk] + 1]))
        for row, a, b in zip(chunk, bounds[:-1], bounds[1:]):
            out[row] = values[a] - values[a + 1:b]
    return out


def geometric_path(points: int, smallest: float = 1e-6) -> PathRule:
    """0, then ``points`` points evenly spaced in log(alpha) from ``smallest`` to 1 (the trapezoid rule in
    log(alpha)): for the empty baseline, whose change is crowded near alpha = 0 (kermt.inference.reference_atom)."""
    alphas = np.geomspace(smallest, 1.0, points)
    weights = alphas * np.log(alphas[1] / alphas[0])  # d(alpha) = alpha d(log alpha)
    weights[[0, -1]] /= 2
    weights[0] += smallest  # [0, smallest]: the gradient there taken as at smallest
    return PathRule(tuple(np.concatenate([[0.0], alphas]).tolist()), tuple(np.concatenate([[0.0], weights]).tolist()))


def method_table(ensemble: Ensemble) -> dict[str, Callable[[FeaturizedMolecules], tuple[list, float | None]]]:
    """name -> (molecules -> (per-row atom values [atoms, T], completeness residual or None))."""
    reference = Baseline.reference()

    def ig(rule: PathRule, baseline: Baseline = reference):
        def run(molecules: FeaturizedMolecules) -> tuple[list, float]:
            found = Attributor(ensemble, rule, baseline=baseline).attribute(molecules)
            gap = found.explained - found.baseline
            sums = np.stack([a.sum(axis=0) for a in found.atoms]) + found.descriptors
            return list(found.atoms), float(np.abs(sums - gap).mean() / np.abs(gap).mean())
        return run

    empty = Baseline(np.zeros(ATOM_FDIM, np.float32), np.zeros(BOND_ONLY_FDIM, np.float32))
    table = {f"ig{n}": ig(PathRule.integrated_gradients(n)) for n in (4, 8, 16, 32)}
    table.update({"ig16_atoms": ig(PathRule.integrated_gradients(16), Baseline(reference.atom, None)),
                  "ig32_empty": ig(geometric_path(32), empty),
                  "gradxinput": ig(PathRule((0.0, 1.0), (0.0, 1.0))),
                  "occlusion": lambda molecules: (occlusion(ensemble, molecules), None)})
    return table


# ---------------------------------------------------------------------------------------------------- scores


def mean_pearson(values: Sequence[np.ndarray], truths: Sequence[np.ndarray]) -> float:
    """The mean over molecules of Pearson(values, truth); molecules where either is constant are left out."""
    scores = [np.corrcoef(v, t)[0, 1] for v, t in zip(values, truths) if len(v) > 2 and v.std() > 0 and t.std() > 0]
    return float(np.mean(scores))


def halogen_share(values: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> float:
    """The mean over molecules with a halogen of the share of sum(|values|) on the halogen atoms."""
    shares = [np.abs(v[m]).sum() / np.abs(v).sum() for v, m in zip(values, masks) if m.any() and np.abs(v).sum()]
    return float(np.mean(shares))


def truths_of(task: str, smiles: Sequence[str]) -> list[np.ndarray]:
    """Per molecule: Crippen's atom contributions (logp), or the halogen indicator (halogens)."""
    return ([crippen_contributions(s) for s in smiles] if task == "logp"
            else [halogen_mask(s).astype(np.float64) for s in smiles])


def scored(task: str, method: str, values: list[np.ndarray], truths: list[np.ndarray]) -> dict:
    """The agreement of per-molecule atom ``values`` with ``truths`` (halogens: on the molecules with one)."""
    row = {"task": task, "method": method, "pearson": mean_pearson(values, truths)}
    if task == "halogens":
        with_halogen = [i for i, t in enumerate(truths) if t.any()]
        row["pearson"] = mean_pearson([values[i] for i in with_halogen], [truths[i] for i in with_halogen])
        row["halogen_share"] = halogen_share(values, [t.astype(bool) for t in truths])
    return row


def score_task(task: str, ensemble: Ensemble, smiles: list[str], methods: Sequence[str],
               first: int = 0) -> list[dict]:
    """Each method's row; ``first`` > 0: also its scores on the first ``first`` molecules alone (``*_first``:
    the molecules chemprop's explanations were run on)."""
    molecules = featurize_smiles(smiles)
    assert molecules.valid.all()
    truths = truths_of(task, smiles)
    table, rows = method_table(ensemble), []
    for name in methods:
        started, cpu_started = time.perf_counter(), time.process_time()
        values, residual = table[name](molecules)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        values = [v[:, 0] for v in values]
        row = scored(task, name, values, truths)
        row.update(residual=residual, molecules=len(smiles), molecules_per_s=len(smiles) / seconds,
                   molecules_per_cpu_s=len(smiles) / cpu_seconds)
        if first:
            row.update({f"{k}_first": v for k, v in scored(task, name, values[:first], truths[:first]).items()
                        if k in ("pearson", "halogen_share")})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    """The figures as a markdown table; ``on the first n``: the scores on the molecules chemprop explained."""
    print("\n| task | method | molecules | mean Pearson | halogen share | on the first n: Pearson, share | residual "
          "| molecules/s | molecules per CPU-s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        share = f"{row['halogen_share']:.2f}" if "halogen_share" in row else ""
        first = (f"{row['pearson_first']:.3f}" + (f", {row['halogen_share_first']:.2f}"
                                                    if "halogen_share_first" in row else "")
                 if "pearson_first" in row else "")
        residual = (f"{row['residual']:.3f}" if row["residual"] is not None else
                    "not measured" if row["method"].startswith("chemprop") else "not additive")
        rationale = f" ({row['with_rationale']} with a rationale)" if "with_rationale" in row else ""
        print(f"| {row['task']} | {row['method']} | {row['molecules']}{rationale} | {row['pearson']:.3f} | {share} "
              f"| {first} | {residual} | {row['molecules_per_s']:.2f} | {row['molecules_per_cpu_s']:.2f} |")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{v:.1f}' for v in os.getloadavg())}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / "runs/bench_attributions")
    parser.add_argument("--epochs", type=int, default=TinySettings.epochs)
    parser.add_argument("--test", type=int, default=200, help="held-out molecules (the file's last ones)")
    parser.add_argument("--methods", nargs="+", default=None, help="default: every method")
    parser.add_argument("--tasks", nargs="+", default=["logp", "halogens"], choices=["logp", "halogens"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared machine, 2 threads spin against other work)")
    parser.add_argument("--chemprop", default=None, metavar="PYTHON",
                        help="chemprop 2.3.1's environment's python: also run bench/chemprop_myerson.py")
    parser.add_argument("--chemprop_epochs", type=int, default=50, help="chemprop train's epochs (its default 50)")
    parser.add_argument("--chemprop_limit", type=int, default=40, help="held-out molecules chemprop explains")
    parser.add_argument("--chemprop_seconds", type=float, default=900.0,
                        help="per chemprop method and task and run (a rerun resumes from its cache)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = pd.read_csv(DEMO)
    data = data[data["logp"].notna()]
    smiles = data["smiles"].tolist()
    train, test = smiles[: -args.test], smiles[-args.test:]
    settings = TinySettings(epochs=args.epochs)
    rows = []
    for task in args.tasks:
        targets = data["logp"].to_numpy() if task == "logp" else halogen_counts(smiles)
        model_dir = train_model(train, targets[: -args.test], task, args.work / task, settings)
        ensemble = ensemble_of(model_dir)
        molecules = featurize_smiles(test)
        started = time.perf_counter()
        predicted = ensemble.predict(molecules, 64).mean[:, 0]
        rate = len(test) / (time.perf_counter() - started)
        rmse = float(np.sqrt(np.mean((predicted - targets[-args.test:]) ** 2)))
        print(f"{task}: held-out RMSE {rmse:.3f} (std of the held-out values {targets[-args.test:].std():.3f}); "
              f"the prediction alone: {rate:.0f} molecules/s")
        first = 0
        if args.chemprop:
            results = run_chemprop(args.chemprop, args.work, task, train, targets[: -args.test], test,
                                   args.chemprop_epochs, args.chemprop_limit, args.chemprop_seconds)
            chemprop = chemprop_rows(task, results, test, targets[-args.test:], truths_of(task, test), scored)
            first = max([row["molecules"] for row in chemprop], default=0)
        rows += score_task(task, ensemble, test, args.methods or list(method_table(ensemble)), first)
        rows += chemprop if args.chemprop else []
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
