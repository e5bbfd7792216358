"""Per-atom attributions of a finetuned model's predictions: integrated gradients from a reference atom (pure torch).

What is explained, per task: regression, the prediction in target units; classification, the LOGIT the two views
share, ``(atom view logit + bond view logit) / 2`` (the probability is the mean of the views' sigmoids, which no
additive split can follow through the sigmoid); an ensemble, the members' mean of each.

The baseline is the same molecule graph with every atom's features replaced by the reference atom's and every
bond's by the reference bond's (:mod:`kermt.inference.reference_atom`: an average drug-like atom and bond), and the
molecule descriptors (``rdkit_2d...``) at 0 in the member's input space (their training mean where the member scales
them). Integrated gradients integrate each input's gradient along the straight path from the baseline to the
molecule, so the values are ADDITIVE::

    sum(atom values) + descriptor share  =  explained value - baseline value   (to the quadrature's error)

An atom's value is the integral for its own feature row plus half of each of its bonds' (a bond's features belong
to both its atoms); the descriptor vector gets its own share. The path is sampled at ``steps + 1`` evenly spaced
points (the trapezoid rule: its ends are the baseline and the explained values, so both come from the same
forward). bench/attributions.py chose the baseline and the steps by measurement against known truth and against the
sum (docs/attributions.md).

Batched: the ``steps + 1`` copies of many molecules are one graph, one forward and one backward per task, of at most
``atoms_per_forward`` atom rows (by default fewer the wider the encoder, and never more than a fixed cap), so
memory is bounded by that budget, not by the batch's size times the path's points. Each molecule is collated at
its reference width (:mod:`kermt.inference.widths`; any width for a zero-padding model), so its values depend on
the molecule and the model only, never on its batch-mates. Atom order: the graph's, which is RDKit's parse order
of the SMILES the model saw (``model_smiles`` where standardisation changed the input). Members run in eval mode:
MC dropout does not enter. Cost: the preset 800-wide encoder gave 0.2 molecules/s on one CPU thread (a 64-wide
one 35): a screen wants GPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kermt.chem.features import ATOM_FDIM
from kermt.data.batch import BatchMolGraph
from kermt.data.featurize import FeaturizedMolecules
from kermt.inference.batches import row_batches
from kermt.inference.ensemble import Ensemble
from kermt.inference.features import scale_features
from kermt.inference.reference_atom import reference_rows
from kermt.inference.widths import WidthRule

DEFAULT_STEPS = 16  # path intervals: bench/attributions.py, docs/attributions.md
MAX_HEAVY_ATOMS = 100  # the budget: a larger molecule gets no attributions (its prediction is kept)
OVER_BUDGET = f"more than {MAX_HEAVY_ATOMS} heavy atoms, the attributions' budget"  # why such a molecule has none
# atom rows (path copies included) x hidden size x attention heads per forward and backward: 2,048 rows of the
# 800-wide, 4-head preset held ~3 GB of activations on the CPU (25,600 rows of a 64-wide 2-head model)
FORWARD_BUDGET = 2_048 * 800 * 4
# ... and at most this many atom rows whatever the width: the inputs on the path (151 atom and 165 bond features a
# row, their differences and gradients) cost about 25 KB per atom row even for a 16-wide encoder, so FORWARD_BUDGET
# alone let the 16-wide fixture classifier take 204,800 rows per forward, 4.3 GB (docs/attributions.md); 4,096 rows
# hold about 110 MB of it there and were no slower (smaller forwards stay in cache)
MAX_ATOM_ROWS = 4_096


@dataclass(frozen=True)
class PathRule:
    """Where the gradient is taken on the path from the baseline (0) to the input (1), and its weight in the
    integral. The first point is 0 and the last 1, so one forward also gives the baseline and explained values."""

    alphas: tuple[float, ...]
    weights: tuple[float, ...]

    @classmethod
    def integrated_gradients(cls, steps: int = DEFAULT_STEPS) -> "PathRule":
        """The trapezoid rule over ``steps`` equal intervals."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        weights = [1.0 / steps] * (steps + 1)
        weights[0] = weights[-1] = 0.5 / steps
        return cls(tuple(float(a) for a in np.linspace(0.0, 1.0, steps + 1)), tuple(weights))


@dataclass(frozen=True)
class Baseline:
    """The input the path starts from: every atom's feature row ``atom`` float32 [151] and every bond's own
    features ``bond`` float32 [14] (None: bonds keep their features, and get no share)."""

    atom: np.ndarray
    bond: np.ndarray | None

    @classmethod
    def reference(cls) -> "Baseline":
        return cls(*reference_rows())


@dataclass(frozen=True)
class Attributions:
    """Per row of a block (float64, task units as in the module docstring):

    atoms        per row [heavy atoms, T], None where the row got none (invalid, or over the budget)
    descriptors  [N, T] the descriptor vector's share; 0 for a model without descriptors, NaN where no values
    baseline     [N, T] the explained value at the baseline (NaN where no values)
    explained    [N, T] the value explained: the prediction, a classifier's mean logit (NaN where no values)
    over_budget  [N] bool: a valid row with more heavy atoms than the budget
    """

    atoms: tuple[np.ndarray | None, ...]
    descriptors: np.ndarray
    baseline: np.ndarray
    explained: np.ndarray
    over_budget: np.ndarray


def unavailable_reason(specs: Sequence, upstream_batching: bool) -> str | None:
    """Why a model used this way cannot give attributions (None: it can). With ``--upstream_batching`` an
    upstream-padded model's number moves with its batch-mates, so no split over its own atoms adds up to it."""
    if upstream_batching and any(spec.encoder.padding != "zero" for spec in specs):
        return ("--upstream_batching makes each prediction depend on its batch-mates, so no per-atom split adds up "
                "to it; predict without --upstream_batching for attributions")
    return None


class Attributor:
    """Integrated gradients of an :class:`Ensemble`'s members (module docstring)."""

    def __init__(self, ensemble: Ensemble, path: PathRule | None = None, *, max_heavy_atoms: int = MAX_HEAVY_ATOMS,
                 atoms_per_forward: int | None = None, baseline: Baseline | None = None) -> None:
        """``atoms_per_forward``: atom rows per forward (path copies included; a molecule's copies are never
        split); default: :data:`FORWARD_BUDGET` over the encoder's width, at most :data:`MAX_ATOM_ROWS`."""
        self.ensemble, self.path = ensemble, path or PathRule.integrated_gradients()
        encoder = ensemble.specs[0].encoder
        self.max_heavy_atoms = max_heavy_atoms
        self.atoms_per_forward = atoms_per_forward or min(
            FORWARD_BUDGET // (encoder.hidden_size * encoder.num_attn_head), MAX_ATOM_ROWS)
        self.baseline = baseline or Baseline.reference()
        # the batch-independent rule whatever the ensemble predicts with (unavailable_reason refuses the one case
        # where that differs from its numbers)
        self.rule = WidthRule(ensemble.rule.reference_width)
        self.operators = ensemble.models[0].kermt.aggregation_spec(training=True)  # with transposes: a backward
        self.regression = ensemble.dataset_type == "regression"

    @property
    def tasks(self) -> int:
        return len(self.ensemble.task_names)

    def attribute(self, molecules: FeaturizedMolecules) -> Attributions:
        """Attributions of every valid row within the budget (see :class:`Attributions`)."""
        n, counts = len(molecules), molecules.graphs.atom_counts.astype(np.int64)
        valid = molecules.valid
        over_budget = valid & (counts > self.max_heavy_atoms)
        todo = valid & ~over_budget
        atoms: list[np.ndarray | None] = [None] * n
        descriptors, baseline, explained = (np.full((n, self.tasks), np.nan) for _ in range(3))
        points = len(self.path.alphas)
        for rows, width in row_batches(todo, max(n, 1), self.rule.widths(molecules.graphs, todo),
                                       counts * points, self.atoms_per_forward):
            per_atom, descriptors[rows], baseline[rows], explained[rows] = self._rows(molecules.select(rows), width)
            for row, values in zip(rows, np.split(per_atom, np.cumsum(counts[rows])[:-1])):
                atoms[row] = values
        return Attributions(tuple(atoms), descriptors, baseline, explained, over_budget)

    def _rows(self, chosen: FeaturizedMolecules, width: int) -> tuple[np.ndarray, ...]:
        """(atoms [A, T], descriptors [n, T], baseline [n, T], explained [n, T]) of ``chosen`` (the members'
        means), its path copies collated as one graph at ``width``."""
        points, n = len(self.path.alphas), len(chosen)
        copies = chosen.select(np.tile(np.arange(n), points))
        graph = copies.batch_graph(self.operators, width).to(self.ensemble.device)
        raw = chosen.features if chosen.features.shape[1] else None
        totals = None
        for model, spec in zip(self.ensemble.models, self.ensemble.specs):
            member = self._member(model, spec, graph, scale_features(spec, raw), n)
            totals = member if totals is None else tuple(a + b for a, b in zip(totals, member))
        return tuple(total / len(self.ensemble.models) for total in totals)

    def _member(self, model: torch.nn.Module, spec, graph: BatchMolGraph, features: torch.Tensor | None,
                n: int) -> tuple[np.ndarray, ...]:
        """One member's (atoms, descriptors, baseline, explained), float64, in the module docstring's units."""
        device, points = self.ensemble.device, len(self.path.alphas)
        weights = torch.tensor(self.path.weights, dtype=torch.float64, device=device)
        n_atoms, n_bonds = (graph.f_atoms.shape[0] - 1) // points, (graph.f_bonds.shape[0] - 1) // points
        with torch.enable_grad():
            path = _Path.of(graph, features, self.baseline, torch.tensor(self.path.alphas, device=device), n)
            out = model(path.graph, path.features)
            logits = (out.atom_view + out.bond_view) / 2  # [points * n, T]: the prediction, or the mean logit
            per_task = [torch.autograd.grad(logits[:, t].sum(), path.inputs, retain_graph=t + 1 < self.tasks)
                        for t in range(self.tasks)]
        atoms, descriptors = [], []
        for grads in per_task:
            bond_terms = grads[1] * path.bond_difference if path.bond_difference is not None else None
            atoms.append(_atom_values(graph, grads[0] * path.atom_difference, bond_terms, weights, n_atoms, n_bonds))
            descriptors.append(_integral(grads[-1] * path.feature_difference, weights, n)
                               if features is not None else torch.zeros(n, dtype=torch.float64, device=device))
        values = logits.detach().double().view(points, n, self.tasks).cpu().numpy()
        return self._units(spec, torch.stack(atoms, 1).cpu().numpy(), torch.stack(descriptors, 1).cpu().numpy(),
                           values[0], values[-1])

    def _units(self, spec, atoms: np.ndarray, descriptors: np.ndarray, baseline: np.ndarray,
               explained: np.ndarray) -> tuple[np.ndarray, ...]:
        """Scaled model outputs -> target units (regression: times each task's std; the ends also plus its mean)."""
        scaler = spec.data_scaler if self.regression else None
        if scaler is None:
            return atoms, descriptors, baseline, explained
        return (atoms * scaler.stds, descriptors * scaler.stds, scaler.inverse_transform(baseline),
                scaler.inverse_transform(explained))


@dataclass(frozen=True)
class _Path:
    """A collated graph's rows moved onto the path: row r of copy k at ``baseline + alpha_k (input - baseline)``.
    ``inputs``: the leaves the gradients are taken for (atom rows, bond rows when bonds are on the path, the
    descriptors); the differences (input - baseline) that multiply each one's gradient."""

    graph: BatchMolGraph
    features: torch.Tensor | None
    inputs: list[torch.Tensor]
    atom_difference: torch.Tensor
    bond_difference: torch.Tensor | None
    feature_difference: torch.Tensor | None

    @classmethod
    def of(cls, graph: BatchMolGraph, features: torch.Tensor | None, baseline: Baseline, alphas: torch.Tensor,
           n: int) -> "_Path":
        points = len(alphas)
        atom_difference = _difference(graph.f_atoms, baseline.atom)
        atoms = graph.f_atoms - atom_difference * (1 - _row_alphas(alphas, (graph.f_atoms.shape[0] - 1) // points))
        inputs = [atoms.requires_grad_()]
        bonds, bond_difference = graph.f_bonds[:, ATOM_FDIM:], None
        if baseline.bond is not None:
            bond_difference = _difference(bonds, baseline.bond)
            bonds = bonds - bond_difference * (1 - _row_alphas(alphas, (bonds.shape[0] - 1) // points))
            inputs.append(bonds.requires_grad_())
        feature_difference = None
        if features is not None:  # the descriptors' baseline: 0 in the member's input space
            feature_difference = features.to(alphas.device).repeat(points, 1)
            features = (feature_difference * alphas.repeat_interleave(n)[:, None]).requires_grad_()
            inputs.append(features)
        on_path = dataclasses.replace(graph, f_atoms=atoms, f_bonds=torch.cat([atoms[graph.b2a], bonds], dim=1))
        return cls(on_path, features, inputs, atom_difference, bond_difference, feature_difference)


def _atom_values(graph: BatchMolGraph, atom_terms: torch.Tensor, bond_terms: torch.Tensor | None,
                 weights: torch.Tensor, n_atoms: int, n_bonds: int) -> torch.Tensor:
    """[A] float64: each atom's integral (gradient x (input - baseline) of its feature row), plus half of each
    of its bonds' when bonds are on the path. The first copy's rows name the atoms (every copy holds the same
    molecules)."""
    values = _integral(atom_terms[1:], weights, n_atoms)
    if bond_terms is not None:
        bonds = _integral(bond_terms[1:], weights, n_bonds) / 2
        edges = torch.arange(1, n_bonds + 1, device=values.device)
        for ends in (graph.b2a[edges], graph.b2a[graph.b2revb[edges]]):  # source, then target atom
            values = values.index_add(0, ends - 1, bonds)
    return values


def _difference(rows: torch.Tensor, baseline: np.ndarray) -> torch.Tensor:
    """``rows`` minus the baseline row, 0 on the padding row 0 (which is no atom or bond and stays 0)."""
    difference = rows - torch.from_numpy(np.asarray(baseline, dtype=np.float32)).to(rows.device)
    difference[0] = 0
    return difference


def _row_alphas(alphas: torch.Tensor, rows_per_copy: int) -> torch.Tensor:
    """[1 + points * rows, 1]: each row's place on the path (copy-major rows; the padding row 0 is on none: its
    difference is 0)."""
    return torch.cat([alphas.new_zeros(1), alphas.repeat_interleave(rows_per_copy)])[:, None]


def _integral(products: torch.Tensor, weights: torch.Tensor, rows: int) -> torch.Tensor:
    """[points * rows, F] gradient x input products -> [rows] float64: summed over features, integrated over the
    path with the rule's weights."""
    return weights @ products.sum(dim=1).double().view(len(weights), rows)


__all__ = ["Attributions", "Attributor", "Baseline", "DEFAULT_STEPS", "FORWARD_BUDGET", "MAX_ATOM_ROWS",
           "MAX_HEAVY_ATOMS", "OVER_BUDGET", "PathRule", "unavailable_reason"]
