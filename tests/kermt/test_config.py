"""Typed config: settings with a fixed set of values are checked when the config is built, with errors that name the
key and the allowed values; upstream's undirected message passing is refused."""

from __future__ import annotations

import pytest
import torch

from kermt.config import EncoderConfig, from_dict, to_dict
from kermt.nn.aggregate import GraphIndex
from tests.kermt.nn.upstream_fixtures import fixture_batch


@pytest.mark.parametrize(
    ("key", "typo", "suggestion"),
    [("padding", "Zero", "zero"), ("padding", "upstram", "upstream"), ("embedding_output_type", "atoms", "atom")],
)
def test_a_typo_in_a_mode_is_an_error_naming_key_and_choices(key, typo, suggestion):
    with pytest.raises(ValueError) as error:
        EncoderConfig(**{key: typo})
    message = str(error.value)
    assert f"{key} {typo!r}" in message and f"did you mean {suggestion!r}" in message
    allowed = ("upstream", "zero") if key == "padding" else ("atom", "bond", "both")
    assert str(allowed) in message


def test_a_typo_in_a_stored_config_is_caught_on_reading():
    stored = to_dict(EncoderConfig(padding="zero"))
    assert from_dict(EncoderConfig, stored).padding == "zero"
    with pytest.raises(ValueError, match="padding 'zero ' is not one of"):
        from_dict(EncoderConfig, {**stored, "padding": "zero "})


def test_graph_index_takes_only_a_known_padding_mode():
    # Before: an unknown mode summed the padding row (as "upstream") yet zeroed it (as "zero"): half of each.
    graph = fixture_batch()
    for mode in ("upstream", "zero"):
        index = GraphIndex.from_batch(graph, mode, torch.float64)
        ones = torch.ones(graph.f_atoms.shape[0], 2, dtype=torch.float64)
        zeroed = index.zero_padding_row(ones)[0].tolist() == [0.0, 0.0]
        sums_padding = bool((index.apply("neighbour_atoms", ones) != graph.a2a.ne(0).sum(1, keepdim=True)).any())
        assert zeroed == (mode == "zero") and sums_padding == (mode == "upstream")
    with pytest.raises(ValueError, match="padding 'Zero' is not one of"):
        GraphIndex.from_batch(graph, "Zero", torch.float64)


def test_undirected_is_refused_because_upstream_cannot_run_it():
    # upstream's MPNEncoder, node view: ``message = (message + message[b2revb]) / 2`` with atom messages [A, h]
    # and the reverse-BOND index b2revb [E]: it indexes past the atom rows (or, if not, adds [A, h] to [E, h]).
    graph = fixture_batch()
    atom_messages = torch.randn(graph.f_atoms.shape[0], 4)
    assert int(graph.b2revb.max()) >= atom_messages.shape[0]
    with pytest.raises(IndexError):
        (atom_messages + atom_messages[graph.b2revb]) / 2
    with pytest.raises(ValueError, match="undirected=True is not supported"):
        EncoderConfig(undirected=True)
    assert EncoderConfig(undirected=False).undirected is False
