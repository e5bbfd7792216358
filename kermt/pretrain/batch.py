"""A worker's part of a global pretraining batch, built so that it does not depend on how the batch is split.

What a molecule sees must be the same on 1 worker with batch 2b as on 2 workers with batch b:
- its labelled atoms / bonds and latent ε are drawn from (seed, global step, molecule id) (:mod:`kermt.pretrain.draws`),
  and so are its dropout masks when the step draws per molecule (the graph's ``molecule_ids`` are corpus rows);
- tensor shapes that numerics depend on are those of the GLOBAL batch: the neighbour table's width (the largest
  in-degree: with upstream padding every missing neighbour adds the padding row, docs/numerics.md#padding-modes) and
  the token length (padding positions are masked, but equal shapes keep the reductions identical).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from kermt.chem.vocab_labels import DEFAULT_LABEL_FRACTION
from kermt.chem.vocab_smiles import END, PAD
from kermt.data.batch import BatchMolGraph
from kermt.data.collate import collate_graphs
from kermt.data.corpus import CorpusArrays
from kermt.data.operators import OperatorSpec
from kermt.data.prefetch import transfer_fields
from kermt.data.sampling import worker_share
from kermt.nn.pretrain.config import PretrainHeadsConfig
from kermt.nn.pretrain.model import PretrainBatch
from kermt.nn.pretrain.vocab_heads import VocabTargets
from kermt.pretrain.draws import labelled_positions, latent_noise
from kermt.random_streams import Stream
from kermt.pretrain.loss import COUNT_NAMES


def _starts(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ``range(s, s + c)`` for each (s, c)."""
    counts = np.asarray(counts, dtype=np.int64)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(_starts(counts)[:-1], counts)
    return np.repeat(np.asarray(starts, dtype=np.int64), counts) + within


@dataclass(frozen=True)
class PretrainData:
    """Molecules as pretraining reads them (a whole corpus, or one global batch read from its shards): their
    arrays, each molecule's largest atom degree (:meth:`of`) and its id, the corpus row that keys its draws
    (``ids``; None: its row here)."""

    arrays: CorpusArrays
    max_in_degree: np.ndarray
    ids: np.ndarray | None = None

    @classmethod
    def of(cls, arrays: CorpusArrays, ids: np.ndarray | None = None) -> "PretrainData":
        return cls(arrays, arrays.graphs.max_in_degrees(), ids)

    def molecule_ids(self, rows: np.ndarray) -> np.ndarray:
        return rows if self.ids is None else np.asarray(self.ids, dtype=np.int64)[rows]

    def __len__(self) -> int:
        return len(self.arrays)


@dataclass(frozen=True)
class StepBatch:
    """One rank's input to a step: the model batch, this rank's counts [len(COUNT_NAMES)] float64, the whole
    global batch's counts (the sum of every rank's, counted on the host: the step needs no collective for them),
    the sizes of every rank's share of the global batch, and this rank's offset in it."""

    batch: PretrainBatch
    counts: torch.Tensor
    global_counts: torch.Tensor
    share_sizes: tuple[int, ...]
    offset: int

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "StepBatch":
        return transfer_fields(self, ("batch", "counts", "global_counts"), device, non_blocking)

    def pin_memory(self) -> "StepBatch":
        return transfer_fields(self, ("batch", "counts", "global_counts"), None, False)


def _graph(arrays: CorpusArrays, rows: np.ndarray, ids: np.ndarray, width: int,
           operators: OperatorSpec | None) -> BatchMolGraph:
    graph = collate_graphs(arrays.graphs.select(rows), operators, neighbour_width=width)
    return replace(graph, molecule_ids=torch.tensor(ids, dtype=torch.int64, device="cpu"))


def _sampled(labels: np.ndarray, chosen: np.ndarray) -> torch.Tensor:
    """[1 + len] int64: the chosen labels, 0 elsewhere, after the padding row's 0."""
    return torch.from_numpy(np.concatenate([[0], np.where(chosen, labels, 0)]).astype(np.int64))


def _tokens(arrays: CorpusArrays, rows: np.ndarray, length: int) -> torch.Tensor:
    """[len(rows), length] int64, right-padded; sequences longer than ``length`` keep their ``<end>``."""
    counts = arrays.token_lengths[rows]
    out = np.full((len(rows), length), PAD, dtype=np.int64)
    ids = arrays.tokens[_ranges(arrays.token_offsets[rows], counts)].astype(np.int64)
    kept = np.minimum(counts, length)
    position = np.arange(int(counts.sum())) - np.repeat(_starts(counts)[:-1], counts)
    keep = position < np.repeat(kept, counts)
    out[np.repeat(np.arange(len(rows)), counts)[keep], position[keep]] = ids[keep]
    truncated = counts > length
    out[truncated, length - 1] = END
    return torch.from_numpy(out)


def build_step_batch(data: PretrainData, global_rows: np.ndarray, rank: int, world_size: int,
                     heads: PretrainHeadsConfig, seed: int, step: int,
                     label_fraction: float = DEFAULT_LABEL_FRACTION,
                     operators: OperatorSpec | None = None) -> StepBatch:
    """Rank ``rank``'s contiguous share of global batch ``global_rows`` (rows of ``data``), with the draws of
    global step ``step``; with the neighbour-sum operators ``operators`` names (the encoder's
    ``aggregation_spec``), built here on the host so that the step on the device does not have to."""
    arrays = data.arrays
    global_rows = np.asarray(global_rows, dtype=np.int64)
    shares = np.array_split(global_rows, world_size)
    rows = worker_share(global_rows, rank, world_size)
    ids = data.molecule_ids(rows)
    width = max(1, int(data.max_in_degree[global_rows].max(initial=0)))
    targets, tokens, noise = None, None, None
    if heads.uses_vocab:
        targets = _vocab_targets(arrays, rows, ids, seed, step, label_fraction)
    if heads.uses_decoder:
        length = min(int(arrays.token_lengths[global_rows].max(initial=2)), heads.decoder_max_seq_len)
        tokens = _tokens(arrays, rows, length)
        noise = torch.from_numpy(latent_noise(seed, step, ids, heads.latent_dim))
    batch = PretrainBatch(_graph(arrays, rows, ids, width, operators), targets, tokens, noise)
    counts = _counts(arrays, rows, targets)
    if world_size > 1:  # the whole batch's, from its own draws: they are per molecule, so each share's are its part
        whole = (_vocab_targets(arrays, global_rows, data.molecule_ids(global_rows), seed, step, label_fraction)
                 if heads.uses_vocab else None)
        global_counts = _counts(arrays, global_rows, whole)
    else:
        global_counts = counts
    return StepBatch(batch, counts, global_counts, tuple(len(s) for s in shares),
                     int(sum(len(s) for s in shares[:rank])))


def _vocab_targets(arrays: CorpusArrays, rows: np.ndarray, ids: np.ndarray, seed: int, step: int,
                   label_fraction: float) -> VocabTargets:
    """The molecules' labelled atoms and bonds (drawn per molecule id for global step ``step``) and fg labels."""
    atom_counts, bond_counts = arrays.graphs.atom_counts[rows], arrays.graphs.bond_counts[rows]
    atom_chosen = labelled_positions(seed, Stream.ATOM_LABELS, step, ids, atom_counts, label_fraction)
    bond_chosen = labelled_positions(seed, Stream.BOND_LABELS, step, ids, bond_counts, label_fraction)
    atoms = arrays.atom_labels[_ranges(arrays.atom_offsets[rows], atom_counts)]
    bonds = arrays.bond_labels[_ranges(arrays.bond_offsets[rows], bond_counts)]
    return VocabTargets(_sampled(atoms, atom_chosen), _sampled(bonds, bond_chosen),
                        torch.from_numpy(arrays.fg_labels[rows].astype(np.float32)))


def _counts(arrays: CorpusArrays, rows: np.ndarray, targets: VocabTargets | None) -> torch.Tensor:
    """[len(COUNT_NAMES)] float64 on the host: molecules, atoms, bonds, labelled atoms and bonds of ``rows``."""
    labelled = [int((targets.atom != 0).sum()), int((targets.bond != 0).sum())] if targets is not None else [0, 0]
    graphs = arrays.graphs
    counts = [len(rows), int(graphs.atom_counts[rows].sum()), int(graphs.bond_counts[rows].sum()), *labelled]
    assert len(counts) == len(COUNT_NAMES)
    return torch.tensor(counts, dtype=torch.float64, device="cpu")


__all__ = ["PretrainData", "StepBatch", "build_step_batch"]
