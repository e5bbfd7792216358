"""Per-molecule draws and batch building: a molecule's labels, latent ε and tokens do not depend on its batch."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from kermt.chem.vocab_smiles import END, PAD
from kermt.pretrain.batch import build_step_batch
from kermt.pretrain.draws import labelled_positions, latent_noise
from kermt.random_streams import Stream
from tests.kermt.pretrain.tiny_corpus import fixture_smiles, tiny_arrays, tiny_heads


def test_labelled_count_per_molecule_is_upstreams_rule() -> None:
    counts = np.array([1, 2, 7, 20, 0, 33])
    chosen = labelled_positions(5, Stream.ATOM_LABELS, 9, np.arange(6), counts, 0.15)
    per_molecule = np.add.reduceat(chosen.astype(int), np.r_[0, np.cumsum(counts)[:-1]])
    assert per_molecule[counts > 0].tolist() == [math.ceil(n * 0.15) for n in counts if n > 0]


def test_a_molecules_draws_do_not_depend_on_its_batch() -> None:
    counts = np.array([12, 30, 9])
    alone = labelled_positions(5, Stream.ATOM_LABELS, 9, np.array([42]), counts[1:2], 0.15)
    together = labelled_positions(5, Stream.ATOM_LABELS, 9, np.array([7, 42, 3]), counts, 0.15)
    assert np.array_equal(alone, together[12:42])
    assert not np.array_equal(alone, labelled_positions(5, Stream.ATOM_LABELS, 10, np.array([42]), counts[1:2], 0.15))
    noise = latent_noise(5, 9, np.array([7, 42, 3]), 512)
    assert np.array_equal(noise[1], latent_noise(5, 9, np.array([42]), 512)[0])
    assert abs(noise.mean()) < 0.1 and abs(noise.std() - 1) < 0.1


def test_worker_batches_are_slices_of_the_global_batch() -> None:
    data, sizes = tiny_arrays(fixture_smiles())
    heads = tiny_heads("hybrid", sizes)
    rows = np.array([4, 17, 9, 0, 22])
    whole = build_step_batch(data, rows, 0, 1, heads, seed=1, step=3)
    parts = [build_step_batch(data, rows, rank, 2, heads, seed=1, step=3) for rank in (0, 1)]
    assert [p.share_sizes for p in parts] == [(3, 2), (3, 2)] and [p.offset for p in parts] == [0, 3]
    assert np.array_equal(np.concatenate([p.batch.tokens for p in parts]), whole.batch.tokens)  # global length
    assert np.array_equal(np.concatenate([p.batch.latent_noise for p in parts]), whole.batch.latent_noise)
    assert {p.batch.graph.a2b.shape[1] for p in parts} == {whole.batch.graph.a2b.shape[1]}  # global width
    assert sum(p.counts for p in parts).tolist() == whole.counts.tolist()
    # every share brings the whole batch's counts, counted on the host: the step needs no all-reduce for them
    assert all(p.global_counts.tolist() == whole.counts.tolist() == whole.global_counts.tolist() for p in parts)
    fg = np.concatenate([p.batch.vocab_targets.fg for p in parts])
    assert np.array_equal(fg, whole.batch.vocab_targets.fg)


def test_long_smiles_are_truncated_keeping_the_end_token() -> None:
    data, sizes = tiny_arrays(fixture_smiles())
    longest = int(np.argmax(data.arrays.token_lengths))
    short = dataclasses.replace(tiny_heads("cmim", sizes), decoder_max_seq_len=8)
    tokens = build_step_batch(data, np.array([longest]), 0, 1, short, seed=0, step=0).batch.tokens[0]
    assert tokens.shape == (8,) and int(tokens[-1]) == END and PAD not in tokens.tolist()
