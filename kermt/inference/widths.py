"""The neighbour width each molecule is computed at: what makes a molecule's number depend on the molecule and the
model only (docs/numerics.md#batch-composition).

With upstream's padding every neighbour sum adds ``width − degree`` copies of the padding row's message, where
``width`` is the width of the neighbour tables the batch was collated with; upstream's collate takes the batch's
largest atom degree, so a molecule's number moves with its batch-mates. Here a model with upstream padding computes
each molecule at its **reference width** ``max(its own largest degree, W)``, ``W`` recorded in the model: for a
model finetuned here, the most frequent neighbour width of its training batches (:func:`training_width_histogram`);
for a checkpoint without a record, :data:`DEFAULT_REFERENCE_WIDTH` (``--reference_width`` overrides either).
Molecules with the same reference width share forwards collated at that width
(:func:`kermt.inference.batches.run_batches`), so the rule costs no throughput. With ``zero`` padding the width
changes no number and every molecule shares one group.

``upstream_batching`` keeps upstream's batch-dependent numbers (each batch of consecutive rows collated at its own
largest degree) for parity with upstream's outputs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kermt.chem.molgraph import FlatGraphs
from kermt.errors import UserError
from kermt.presets import UPSTREAM_REFERENCE_WIDTH

if TYPE_CHECKING:
    from kermt.data.dataset import MoleculeSet
    from kermt.data.molecule_shards import TrainingSource

# For a checkpoint that records no W (upstream's): kermt.presets says how it was chosen.
DEFAULT_REFERENCE_WIDTH = UPSTREAM_REFERENCE_WIDTH


@dataclass(frozen=True)
class WidthRule:
    """How a model's molecules are collated. ``reference_width`` None: the model's numbers do not depend on the
    width (``zero`` padding). ``upstream_batching``: upstream's batch-dependent collate instead of the reference
    width."""

    reference_width: int | None
    upstream_batching: bool = False

    def widths(self, graphs: FlatGraphs, valid: np.ndarray | None = None) -> np.ndarray | None:
        """int64 [N]: the width each valid row is collated at, 0 for an invalid row (``valid`` None: every row is
        valid); None with ``upstream_batching``: each batch of consecutive rows at its own largest degree."""
        if self.upstream_batching:
            return None
        valid = np.ones(len(graphs), dtype=bool) if valid is None else valid
        if self.reference_width is None:
            return valid.astype(np.int64)  # width 1: each batch's own width, which changes no number
        return np.where(valid, np.maximum(graphs.max_in_degrees(), self.reference_width), 0).astype(np.int64)


def width_rule(specs: Sequence, upstream_batching: bool = False, reference_width: int | None = None) -> WidthRule:
    """The rule of a model made of checkpoints with these specs (:class:`kermt.checkpoint.CheckpointSpec`).

    Every member must share one padding mode. With upstream padding ``W`` is ``reference_width`` when given, else
    the largest recorded among the members (members of one run train on the same molecules and nearly always agree;
    one width keeps one collate per batch for all of them), else :data:`DEFAULT_REFERENCE_WIDTH`."""
    if reference_width is not None and reference_width < 1:
        raise UserError(f"--reference_width must be >= 1, got {reference_width}")
    paddings = {spec.encoder.padding for spec in specs}
    if len(paddings) > 1:
        raise UserError(f"ensemble members disagree on padding {sorted(paddings)}: predict with each group separately")
    recorded = [spec.reference_width for spec in specs if spec.reference_width is not None]
    return padding_rule(paddings.pop(), reference_width or max(recorded, default=None), upstream_batching)


def padding_rule(padding: str, reference_width: int | None = None, upstream_batching: bool = False) -> WidthRule:
    """The rule of a model with this padding mode and recorded ``W`` (None: :data:`DEFAULT_REFERENCE_WIDTH`)."""
    if padding == "zero":
        return WidthRule(None, upstream_batching)
    return WidthRule(reference_width or DEFAULT_REFERENCE_WIDTH, upstream_batching)


def upstream_batching_note(specs: Sequence) -> str | None:
    """The one-line note for ``--upstream_batching`` on a model whose numbers never depend on the batch."""
    if all(spec.encoder.padding == "zero" for spec in specs):
        return ("note: --upstream_batching changes nothing for this model: it has zero padding, so no number depends "
                "on the batch")
    return None


def training_width_histogram(train: "FlatGraphs | MoleculeSet | TrainingSource", seed: int, epochs: int,
                             global_batch_size: int) -> dict[int, int]:
    """{width: number of training batches}: the neighbour widths of a finetune's global batches over ``epochs``
    (the epoch orders its training source's plan draws, :mod:`kermt.data.molecule_shards`; graphs held in memory
    are a one-shard source), before bond dropout, which prediction never applies. Reads no shard: the source
    carries each molecule's largest degree."""
    from kermt.data.dataset import MoleculeSet
    from kermt.data.molecule_shards import training_source

    if isinstance(train, FlatGraphs):
        train = MoleculeSet(train, None, np.zeros((len(train), 0), np.float32), ("",) * len(train))
    source = training_source(train)
    plan, degrees = source.plan(seed), source.degrees.astype(np.int64)
    counts: Counter[int] = Counter()
    for epoch in range(epochs):
        ordered = degrees[plan.epoch_ids(epoch)]
        if len(ordered):
            counts.update(np.maximum.reduceat(ordered, np.arange(0, len(ordered), global_batch_size)).tolist())
    return dict(sorted(counts.items()))


def most_frequent_width(histogram: dict[int, int]) -> int | None:
    """The reference width a histogram gives: its most frequent width (the larger on a tie), None when empty."""
    if not histogram:
        return None
    return max(histogram, key=lambda width: (histogram[width], width))


__all__ = ["DEFAULT_REFERENCE_WIDTH", "WidthRule", "most_frequent_width", "padding_rule",
           "training_width_histogram", "upstream_batching_note", "width_rule"]
