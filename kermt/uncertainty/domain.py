"""Applicability domain: how far a molecule is from the training set in the model's own embedding (no ray).

* The embedding (:func:`model_embeddings`) is what the model's FFN heads read: the trained readout of both views
  (``atom_from_atom`` and ``atom_from_bond``), concatenated, before any molecule features are appended. It is the
  representation the prediction is made from, so "far in it" means "far from what the heads were fitted on".
* The metric is euclidean on **standardised** embeddings (each dimension centred and scaled by the training
  molecules' mean and spread, so a few large-valued dimensions do not decide every distance), projected onto the
  training set's top principal components (at most :data:`MAX_COMPONENTS`): a readout is a mean over atoms whose
  length carries information, which cosine would discard, and the projection keeps the k-NN query cheap at
  screening scale (1,024 molecules against 50,000 in 64 dimensions) and drops directions the training set does not
  vary in.
* The distance of a molecule is the mean euclidean distance to its ``k`` nearest training molecules (scikit-learn's
  :class:`~sklearn.neighbors.NearestNeighbors`, brute force: exact and deterministic). The threshold is the
  ``quantile`` of the held-out (validation) molecules' distances to the training set: ``in_domain`` means "as close
  to training as 95 % of the validation molecules were".
* Saved as data, never pickle: ``domain_embeddings.safetensors`` (float32: standardisation, components, the
  projected training molecules; at most :data:`MAX_TRAINING_MOLECULES`, a seeded random subsample beyond) and
  ``domain.json`` (k, metric, threshold, quantile, sizes, the arrays' sha256 and the model's identity: the sha256
  of the weights the embedding comes from, so an index of another model is refused).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kermt.data import atomic_files
from kermt.errors import UserError
from kermt.run_layout import DOMAIN_ARRAYS_FILE, DOMAIN_FILE  # fold_k/: settings and threshold; arrays (float32)
from kermt.uncertainty.calibration_file import read_json_file

if TYPE_CHECKING:
    from kermt.data.featurize import FeaturizedMolecules

DOMAIN_FORMAT, DOMAIN_VERSION = "kermt-domain", 1
METRIC = "euclidean, standardised embedding projected on the training set's top principal components"
DEFAULT_K, DEFAULT_QUANTILE = 5, 0.95
MAX_TRAINING_MOLECULES, MAX_COMPONENTS = 50_000, 64
HOW_TO_GET_ONE = ("train it again with this kermt: `kermt finetune` saves each fold's applicability domain "
                  f"(fold_k/{DOMAIN_FILE}, from its train and validation splits)")
MIN_HELD_OUT = 10  # fewer validation molecules than this give no threshold worth the name
SUBSAMPLE_SEED = 0
EMBEDDING_PREFIXES = ("kermt.", "readout.")  # the weights the embedding depends on (the model's identity)
ARRAY_NAMES = ("mean", "scale", "components", "training")
REQUIRED_KEYS = ("k", "quantile", "threshold", "model_identity", "n_training_total", "arrays_sha256")


def model_embeddings(model: Any, molecules: "FeaturizedMolecules", batch_size: int,
                     device: Any = "cpu", rule: Any = None) -> np.ndarray:
    """float32 [n_rows, 2 x readout size]: each row's readout of both views (the FFN input without the molecule
    features), NaN rows for invalid molecules. Batched as predictions are made (:func:`kermt.inference.run_batches`,
    each molecule at its reference width); ``model`` is a :class:`~kermt.nn.finetune.KermtFinetuneModel`, ``rule``
    its :class:`~kermt.inference.widths.WidthRule` (default: its padding's, with the default reference width)."""
    import torch

    from kermt.inference import run_batches
    from kermt.inference.widths import padding_rule

    rule = rule if rule is not None else padding_rule(model.kermt.config.padding)

    model.eval()
    width = 2 * model.readout.output_size
    out = np.full((len(molecules), width), np.nan, np.float32)

    @torch.no_grad()
    def forward(batch):
        encoded = model.kermt(batch.graph)
        views = torch.stack([encoded.atom_from_atom, encoded.atom_from_bond])
        readouts = model.readout(views, batch.graph.a_scope, batch.graph.max_atoms)
        return torch.cat([readouts[0], readouts[1]], dim=1)

    operators = model.kermt.aggregation_spec(training=False)
    for rows, values in run_batches(molecules, batch_size, operators, lambda _: (), torch.device(device), forward,
                                    lambda launched: launched.float().cpu().numpy(),
                                    widths=rule.widths(molecules.graphs, molecules.valid)):
        out[rows] = values
    return out


def embedding_identity(state_dict: dict[str, Any]) -> str:
    """sha256 of the encoder and readout weights (names, shapes, float32 bytes): the same for a model in memory
    and its saved checkpoint, different for any other model."""
    digest = hashlib.sha256()
    for name in sorted(k for k in state_dict if k.startswith(EMBEDDING_PREFIXES)):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class DomainIndex:
    """A training set's embedding as the k-NN index reads it, and the in-domain threshold (see the module)."""

    k: int
    quantile: float
    threshold: float
    identity: str  # embedding_identity of the model whose embedding this is
    n_training_total: int  # training molecules the model saw (``training`` holds at most MAX_TRAINING_MOLECULES)
    mean: np.ndarray  # float32 [D]
    scale: np.ndarray  # float32 [D]
    components: np.ndarray  # float32 [C, D]
    training: np.ndarray  # float32 [N, C], the training molecules projected
    source: str = ""
    held_out: dict[str, float] | None = None  # the threshold's held-out distances: n, median, the quantile

    def project(self, embeddings: np.ndarray) -> np.ndarray:
        """[n, D] embeddings -> float64 [n, C] in the index's space."""
        standard = (np.asarray(embeddings, np.float64) - self.mean.astype(np.float64)) / self.scale.astype(np.float64)
        return standard @ self.components.astype(np.float64).T

    def in_domain(self, distances: np.ndarray) -> np.ndarray:
        return np.asarray(distances) <= self.threshold


class DomainSearch:
    """The fitted index (build it once per process: the fit copies the training molecules)."""

    def __init__(self, index: DomainIndex) -> None:
        from sklearn.neighbors import NearestNeighbors

        self.index = index
        self.neighbours = NearestNeighbors(n_neighbors=index.k, algorithm="brute", metric="euclidean")
        self.neighbours.fit(index.training.astype(np.float64))

    def neighbour_distances(self, embeddings: np.ndarray) -> np.ndarray:
        """float64 [n, k] distances to the k nearest training molecules, ascending; NaN rows for NaN embeddings."""
        embeddings = np.asarray(embeddings)
        out = np.full((len(embeddings), self.index.k), np.nan)
        rows = np.flatnonzero(np.isfinite(embeddings).all(axis=1)) if embeddings.size else np.zeros(0, np.int64)
        if len(rows):
            out[rows] = self.neighbours.kneighbors(self.index.project(embeddings[rows]), return_distance=True)[0]
        return out

    def distances(self, embeddings: np.ndarray) -> np.ndarray:
        """float64 [n]: the mean distance to the k nearest training molecules (the ``domain_distance`` column)."""
        return self.neighbour_distances(embeddings).mean(axis=1)


class DomainScorer:
    """A model's applicability domain, ready to score molecules: the fitted index and the model whose embedding it
    reads (build it once per process: the screening actors and the service's replicas each hold one)."""

    def __init__(self, index: DomainIndex, model: Any, device: Any = "cpu", rule: Any = None) -> None:
        """``rule``: the model's :class:`~kermt.inference.widths.WidthRule` (an ensemble's ``rule``)."""
        self.search, self.model, self.device, self.rule = DomainSearch(index), model, device, rule

    def __call__(self, molecules: "FeaturizedMolecules", batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(``domain_distance`` float64 [n], NaN where invalid; ``in_domain`` bool [n], False where invalid)."""
        embeddings = model_embeddings(self.model, molecules, batch_size, self.device, self.rule)
        distances = self.search.distances(embeddings)
        return distances, self.search.index.in_domain(np.nan_to_num(distances, nan=np.inf))


@dataclass(frozen=True)
class RunDomain:
    """A run's applicability domain as :func:`run_domain` finds it: the index and its file, or why there is none."""

    index: DomainIndex | None
    path: Path | None = None
    why_not: str | None = None


def run_domain(root: str | Path, first_member: Any) -> RunDomain:
    """The applicability domain of the ensemble under ``root`` (a run's directory): its first member's fold's
    index, checked against that member's weights (a :class:`~kermt.checkpoint.Checkpoint`); none when the run was
    trained before the domain existed or the file is a stale one of another model."""
    from kermt.checkpoint import load_finetune_model
    from kermt.run_layout import fold_directory

    fold = fold_directory(Path(root), Path(first_member.path))
    if fold is None:
        return RunDomain(None, why_not=f"no {DOMAIN_FILE} beside its first member {first_member.path}: it was "
                                       f"trained before the domain existed; {HOW_TO_GET_ONE}")
    index = load_domain(str(fold))
    model, _ = load_finetune_model(first_member)  # the weights the runners embed with (a file may hold unbuilt ones)
    if index.identity != embedding_identity(model.state_dict()):
        return RunDomain(None, why_not=f"{fold / DOMAIN_FILE} was built from another model than {first_member.path} "
                                       f"(the weights' sha256 differs: a stale file); {HOW_TO_GET_ONE}")
    return RunDomain(index, fold / DOMAIN_FILE)


def fit_domain(training: np.ndarray, held_out: np.ndarray, identity: str, k: int = DEFAULT_K,
               quantile: float = DEFAULT_QUANTILE, max_training: int = MAX_TRAINING_MOLECULES,
               source: str = "", n_training_total: int | None = None) -> DomainIndex:
    """The index of ``training`` embeddings [N, D] and its threshold from ``held_out`` [M, D] (molecules the model
    did not train on); a ValueError when there are too few of either. ``n_training_total``: the size of the
    training set when ``training`` is already its :func:`training_rows` (so only those were embedded)."""
    index = fit_index(training, len(held_out), identity, k, quantile, max_training, source, n_training_total)
    return with_threshold(index, DomainSearch(index).distances(np.asarray(held_out, np.float64)))


def fit_index(training: np.ndarray, n_held_out: int, identity: str, k: int = DEFAULT_K,
              quantile: float = DEFAULT_QUANTILE, max_training: int = MAX_TRAINING_MOLECULES,
              source: str = "", n_training_total: int | None = None) -> DomainIndex:
    """The first half of :func:`fit_domain`: the index of ``training`` without its threshold (0), so that the
    held-out molecules' distances can be computed a part at a time (:func:`with_threshold`). ``n_held_out``: how
    many held-out molecules there will be (a ValueError, as fit_domain's, when too few)."""
    training = np.asarray(training, np.float64)
    if n_held_out < MIN_HELD_OUT or len(training) < 2:
        raise ValueError(f"{len(training)} training and {n_held_out} validation molecule(s): a domain needs at "
                         f"least 2 and {MIN_HELD_OUT}")
    kept = training[training_rows(len(training), max_training)]
    mean, scale = kept.mean(axis=0), kept.std(axis=0)
    scale = np.where(scale > 1e-6 * max(float(scale.max(initial=0.0)), 1e-12), scale, 1.0)  # constant dimensions
    components = _principal_components((kept - mean) / scale)
    index = DomainIndex(k=min(k, len(kept)), quantile=quantile, threshold=0.0, identity=identity,
                        n_training_total=n_training_total or len(training), mean=mean.astype(np.float32),
                        scale=scale.astype(np.float32), components=components.astype(np.float32),
                        training=np.zeros((0, len(components)), np.float32), source=source)
    return replace(index, training=index.project(kept).astype(np.float32))


def with_threshold(index: DomainIndex, held_out_distances: np.ndarray) -> DomainIndex:
    """The second half of :func:`fit_domain`: ``index`` with the threshold its held-out molecules' distances set
    (float64 [M], NaN for a molecule without an embedding, which sets nothing)."""
    held = np.asarray(held_out_distances, np.float64)
    held = held[np.isfinite(held)]
    if len(held) < MIN_HELD_OUT:
        raise ValueError(f"{len(held)} validation molecule(s) with an embedding: a domain needs {MIN_HELD_OUT}")
    threshold = float(np.quantile(held, index.quantile))
    return replace(index, threshold=threshold, held_out={"n": len(held), "median": float(np.median(held)),
                                                          f"q{index.quantile:g}": threshold})


def training_rows(n: int, max_training: int = MAX_TRAINING_MOLECULES) -> np.ndarray:
    """The training rows the index keeps: all, or a seeded random subsample of ``max_training`` (sorted), so a
    re-run keeps the same molecules."""
    if n <= max_training:
        return np.arange(n)
    return np.sort(np.random.default_rng(SUBSAMPLE_SEED).choice(n, max_training, replace=False))


def _principal_components(standard: np.ndarray) -> np.ndarray:
    """[C, D] orthonormal directions of the most variance (C <= MAX_COMPONENTS), seeded (deterministic)."""
    from sklearn.decomposition import PCA

    n, d = standard.shape
    count = min(MAX_COMPONENTS, d, n - 1)
    solver = "randomized" if count < min(n, d) // 2 else "full"
    return PCA(n_components=count, svd_solver=solver, random_state=SUBSAMPLE_SEED).fit(standard).components_


def save_domain(directory: str, index: DomainIndex) -> None:
    """``directory``/domain_embeddings.safetensors then ``directory``/domain.json (the JSON names the arrays'
    sha256, so a reader never pairs it with other arrays), each written atomically."""
    from safetensors.numpy import save

    blob = save({name: np.ascontiguousarray(getattr(index, name), np.float32) for name in ARRAY_NAMES},
                metadata={"format": DOMAIN_FORMAT})

    def write(fs, tmp: str) -> None:
        with fs.open_output_stream(tmp) as out:
            out.write(blob)

    atomic_files.write_atomically(atomic_files.join(directory, DOMAIN_ARRAYS_FILE), write)
    record = {"format": DOMAIN_FORMAT, "version": DOMAIN_VERSION, "metric": METRIC, "k": index.k,
              "quantile": index.quantile, "threshold": index.threshold, "embedding_dim": int(index.mean.shape[0]),
              "components": int(index.components.shape[0]), "n_training": int(index.training.shape[0]),
              "n_training_total": index.n_training_total, "max_training": MAX_TRAINING_MOLECULES,
              "subsample_seed": SUBSAMPLE_SEED, "held_out": index.held_out, "source": index.source,
              "model_identity": index.identity, "arrays_file": DOMAIN_ARRAYS_FILE,
              "arrays_sha256": hashlib.sha256(blob).hexdigest()}
    atomic_files.write_text(atomic_files.join(directory, DOMAIN_FILE), json.dumps(record, indent=1) + "\n")


def load_domain(directory: str) -> DomainIndex:
    """The index saved in ``directory``; a missing, malformed or mismatched file is a UserError naming it."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    path = atomic_files.join(directory, DOMAIN_FILE)
    record = read_json_file(path, "applicability domain file")
    if not isinstance(record, dict) or record.get("format") != DOMAIN_FORMAT or record.get("version") != DOMAIN_VERSION:
        raise UserError(f"{path}: not a {DOMAIN_FORMAT} version {DOMAIN_VERSION} file")
    missing = [key for key in REQUIRED_KEYS if key not in record]
    if missing:
        raise UserError(f"{path}: key(s) {missing} missing; re-run `kermt finetune` to rebuild it")
    arrays_path = atomic_files.join(directory, DOMAIN_ARRAYS_FILE)
    fs, inner = atomic_files.filesystem(arrays_path)
    try:
        with fs.open_input_stream(inner) as handle:
            blob = handle.read()
        if hashlib.sha256(blob).hexdigest() != record.get("arrays_sha256"):
            raise UserError(f"{arrays_path} is not the file {path} was written with (sha256 differs); re-run "
                            "`kermt finetune` to rebuild both")
        arrays = load(blob)
    except (OSError, SafetensorError) as error:
        raise UserError(f"{arrays_path}: unreadable ({error}); re-run `kermt finetune` to rebuild it") from error
    return DomainIndex(k=int(record["k"]), quantile=float(record["quantile"]), threshold=float(record["threshold"]),
                       identity=str(record["model_identity"]), n_training_total=int(record["n_training_total"]),
                       source=str(record.get("source", "")), held_out=record.get("held_out"),
                       **{name: arrays[name] for name in ARRAY_NAMES})


__all__ = ["DEFAULT_K", "DEFAULT_QUANTILE", "DOMAIN_ARRAYS_FILE", "DOMAIN_FILE", "DomainIndex", "DomainScorer",
           "DomainSearch", "HOW_TO_GET_ONE", "METRIC", "RunDomain", "embedding_identity", "fit_domain", "fit_index",
           "load_domain", "model_embeddings", "run_domain", "save_domain", "training_rows", "with_threshold"]
