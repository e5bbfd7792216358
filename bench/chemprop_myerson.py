"""chemprop 2.3.1's per-atom explanations of a from-scratch chemprop model, for bench/attributions.py (issue 39).

Runs in chemprop's own environment (it never imports kermt), called by ``bench/attributions.py --chemprop PYTHON``:

    /tmp/chemprop-venv/bin/python bench/chemprop_myerson.py --work DIR --task logp --train train.csv \
        --test test.csv [--epochs 50] [--methods mcts myerson] [--limit 40] [--seconds 600]

``train.csv``: columns ``smiles`` and ``target``; ``test.csv``: column ``smiles``. The model is trained by the real
``chemprop train`` command with its defaults (D-MPNN 300 wide, depth 3, 50 epochs, ...), except that its split is
the bench's: 90 % train, 10 % validation, no test (``--split-sizes 0.9 0.1 0.0``), on kermt's training molecules.
Cached under ``DIR/<task>/model`` while the data and epochs stay the same.

Methods, each writing one JSON line per held-out molecule to ``DIR/<task>/<method>.jsonl`` (a rerun resumes after
the last line written; ``--limit`` molecules at most, stopping early once ``--seconds`` are spent):

* ``myerson``: Myerson values (the Shapley value of the game restricted to connected atom sets), as
  ``chemprop predict --callback myerson`` computes them: the ``myerson`` package's exact explainer for molecules of
  at most 20 heavy atoms, its sampler (1,000 samples) above. One value per heavy atom, additive: they sum to the
  prediction minus the model's value for the empty molecule.
* ``mcts``: the substructure ("rationale") search of Jin et al. that chemprop v1 shipped as ``chemprop_interpret``
  and chemprop 2.3 shows in examples/interpreting_monte_carlo_tree_search.ipynb, written here from that
  description with the notebook's settings: 10 rollouts, c_puct 10, rationales of 8 to 20 atoms, property
  threshold 0.5 (the notebook's value; a molecule predicted at most 0.5 gets no search). Clusters are the non-ring
  bonds and the smallest rings; each step deletes one peripheral cluster; a state's score is the model's
  prediction for the substructure's SMILES. **Per-atom values:** 1 for the atoms of the best rationale (of the
  smallest satisfying size, the highest score), 0 elsewhere (``values``); and ``share``: for each atom, the share of
  all satisfying rationales found that hold it. A molecule without a rationale gets zeros (constant: the scorers
  leave it out; ``found`` says whether there was one).

Each line holds ``seconds`` and ``cpu_seconds`` of that molecule's explanation (the model loaded once, one torch
thread; model calls are batched over a state's children, which is faster than the notebook's batch of 1).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rdkit import Chem, RDLogger

RDLogger.DisableLog("rdApp.*")  # fragments with broken aromatic rings are expected and skipped


@dataclass(frozen=True)
class SearchSettings:
    """The notebook's MCTS settings (examples/interpreting_monte_carlo_tree_search.ipynb, chemprop 2.3.1)."""

    rollouts: int = 10
    c_puct: float = 10.0
    atoms: tuple[int, int] = (8, 20)  # a search stops at the first, a rationale holds at most the second
    threshold: float = 0.5


# ------------------------------------------------------------------------------------------------------ model


def train(work: Path, train_csv: Path, epochs: int) -> Path:
    """The checkpoint of ``chemprop train`` on ``train_csv`` (reused when trained on the same file and epochs)."""
    out, record = work / "model", work / "model.json"
    key = {"data": train_csv.read_text(), "epochs": epochs}
    found = sorted(out.glob("**/best*.pt"))
    if record.is_file() and json.loads(record.read_text()) == key and found:
        return found[0]
    command = [str(Path(sys.executable).parent / "chemprop"), "train", "-i", str(train_csv), "-s", "smiles",
               "--target-columns", "target", "-t", "regression", "-o", str(out), "--epochs", str(epochs),
               "--split-sizes", "0.9", "0.1", "0.0", "--data-seed", "0", "--pytorch-seed", "0",
               "--num-workers", "0", "--accelerator", "cpu", "--devices", "1"]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    record.write_text(json.dumps(key))
    return sorted(out.glob("**/best*.pt"))[0]


class Scorer:
    """A chemprop model's predictions for SMILES, batched (its regression output in the target's units)."""

    def __init__(self, checkpoint: Path):
        from chemprop.featurizers import SimpleMoleculeMolGraphFeaturizer
        from chemprop.models import MPNN

        self.model = MPNN.load_from_file(str(checkpoint)).eval()
        self.featurizer = SimpleMoleculeMolGraphFeaturizer()

    def graph(self, smiles: str):
        return self.featurizer(Chem.MolFromSmiles(smiles))

    def __call__(self, smiles: list[str]) -> np.ndarray:
        from chemprop.data import BatchMolGraph

        with torch.no_grad():
            return self.model(BatchMolGraph([self.graph(s) for s in smiles]))[:, 0].double().numpy()


# ------------------------------------------------------------------------------------------------ Myerson


def myerson_values(scorer: Scorer, smiles: str, exact_up_to: int = 20) -> np.ndarray:
    """The callback's choice: exact Myerson values up to ``exact_up_to`` heavy atoms, sampled above."""
    from myerson.chemprop_explain import MyersonExplainer, MyersonSamplingExplainer

    graph = scorer.graph(smiles)
    with torch.no_grad():
        if graph.V.shape[0] > exact_up_to:
            return np.asarray(MyersonSamplingExplainer(graph, scorer.model).sample_all_myerson_values(), float)
        return np.asarray(MyersonExplainer(graph, scorer.model).calculate_all_myerson_values(), float)


# ----------------------------------------------------------------------------------------------------- MCTS


@dataclass
class State:
    """A substructure: its atoms (indices into the whole molecule), its score, and the search's statistics."""

    atoms: frozenset
    score: float = 0.0
    visits: int = 0
    total: float = 0.0
    children: list = field(default_factory=list)
    expanded: bool = False

    def value(self, sibling_visits: int, c_puct: float) -> float:
        mean = self.total / self.visits if self.visits else 0.0
        return mean + c_puct * self.score * math.sqrt(sibling_visits) / (1 + self.visits)


def clusters_of(mol: Chem.Mol) -> list[frozenset]:
    """The units a step may delete: every bond outside a ring, and every smallest ring."""
    units = [frozenset((b.GetBeginAtomIdx(), b.GetEndAtomIdx())) for b in mol.GetBonds() if not b.IsInRing()]
    units += [frozenset(ring) for ring in Chem.GetSymmSSSR(mol)]
    return units or [frozenset({0})]


def fragment_smiles(mol: Chem.Mol, atoms: frozenset) -> str | None:
    """Canonical SMILES of the substructure on ``atoms`` (lost neighbours become hydrogens): written from the
    Kekulé form first, since a ring cut open cannot stay aromatic; None when neither form parses."""
    for kekule in (True, False):
        copy = Chem.Mol(mol)
        if kekule:
            Chem.Kekulize(copy, clearAromaticFlags=True)
        text = Chem.MolFragmentToSmiles(copy, atomsToUse=sorted(atoms), kekuleSmiles=kekule)
        parsed = Chem.MolFromSmiles(text)
        if parsed is not None:
            return Chem.MolToSmiles(parsed)
    return None


class Search:
    """One molecule's tree: states keyed by the substructure's SMILES, so that equal ones are shared."""

    def __init__(self, smiles: str, scorer: Scorer, settings: SearchSettings):
        self.mol, self.scorer, self.settings = Chem.MolFromSmiles(smiles), scorer, settings
        self.units = clusters_of(self.mol)
        self.root = State(frozenset(range(self.mol.GetNumAtoms())))
        self.states: dict[str, State] = {}

    def expand(self, state: State) -> None:
        """Children: the state minus each cluster that can go without splitting it (one that touches a single other
        cluster of the state, or a bond hanging off it by one atom); only the atoms in no other cluster leave."""
        state.expanded = True
        inside = [u for u in self.units if u <= state.atoms]
        fresh: dict[str, State] = {}  # states not seen before, scored in one batch
        for unit in inside:
            others = [u for u in inside if u is not unit]
            touching = sum(1 for u in others if u & unit)
            leaves = frozenset(a for a in unit if not any(a in u for u in others))
            if not (touching == 1 or (len(unit) == 2 and len(leaves) == 1)) or not leaves:
                continue
            smiles = fragment_smiles(self.mol, state.atoms - leaves)
            if smiles is None:
                continue
            child = self.states.get(smiles) or fresh.setdefault(smiles, State(state.atoms - leaves))
            if all(child is not c for c in state.children):
                state.children.append(child)
        if fresh:
            for (smiles, child), score in zip(fresh.items(), self.scorer(list(fresh))):
                child.score = float(score)
                self.states[smiles] = child

    def rollout(self, state: State) -> float:
        if len(state.atoms) <= self.settings.atoms[0]:
            return state.score
        if not state.expanded:
            self.expand(state)
        if not state.children:
            return state.score
        visits = sum(c.visits for c in state.children)
        chosen = max(state.children, key=lambda c: c.value(visits, self.settings.c_puct))
        value = self.rollout(chosen)
        chosen.total += value
        chosen.visits += 1
        return value

    def run(self) -> list[State]:
        """The satisfying rationales found: at most ``atoms[1]`` atoms, a score of at least the threshold."""
        for _ in range(self.settings.rollouts):
            self.rollout(self.root)
        return [s for s in self.states.values()
                if len(s.atoms) <= self.settings.atoms[1] and s.score >= self.settings.threshold]


def mcts_values(scorer: Scorer, smiles: str, settings: SearchSettings) -> dict:
    atoms = Chem.MolFromSmiles(smiles).GetNumAtoms()
    best, share = np.zeros(atoms), np.zeros(atoms)
    prediction = float(scorer([smiles])[0])
    found = Search(smiles, scorer, settings).run() if prediction > settings.threshold else []
    if found:
        smallest = min(len(s.atoms) for s in found)
        chosen = max((s for s in found if len(s.atoms) == smallest), key=lambda s: s.score)
        best[sorted(chosen.atoms)] = 1.0
        for state in found:
            share[sorted(state.atoms)] += 1.0 / len(found)
    return {"values": best.tolist(), "share": share.tolist(), "found": bool(found), "prediction": prediction}


# ------------------------------------------------------------------------------------------------------ main


def explain_all(path: Path, smiles: list[str], explain, limit: int, seconds: float) -> None:
    """Append one JSON line per molecule to ``path``, after those already there, until ``limit`` or ``seconds``."""
    done = len(path.read_text().splitlines()) if path.is_file() else 0
    started = time.perf_counter()
    with path.open("a") as out:
        for text in smiles[done:limit]:
            if time.perf_counter() - started > seconds:
                break
            wall, cpu = time.perf_counter(), time.process_time()
            found = explain(text)
            found = found if isinstance(found, dict) else {"values": np.asarray(found).ravel().tolist()}
            found.update(smiles=text, seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu)
            out.write(json.dumps(found) + "\n")
            out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--train", type=Path, required=True, help="CSV: smiles, target")
    parser.add_argument("--test", type=Path, required=True, help="CSV: smiles")
    parser.add_argument("--epochs", type=int, default=50, help="chemprop train's default: 50")
    parser.add_argument("--methods", nargs="+", default=["mcts", "myerson"], choices=["mcts", "myerson"])
    parser.add_argument("--limit", type=int, default=40, help="held-out molecules explained at most, per method")
    parser.add_argument("--seconds", type=float, default=600.0, help="per method and run; a rerun resumes")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    work = args.work / args.task
    work.mkdir(parents=True, exist_ok=True)
    scorer = Scorer(train(work, args.train, args.epochs))
    test = pd.read_csv(args.test)["smiles"].tolist()
    predictions = scorer(test)
    (work / "predictions.json").write_text(json.dumps({"smiles": test, "predicted": predictions.tolist()}))
    methods = {"mcts": lambda s: mcts_values(scorer, s, SearchSettings()),
               "myerson": lambda s: myerson_values(scorer, s)}
    for method in args.methods:
        explain_all(work / f"{method}.jsonl", test, methods[method], args.limit, args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
