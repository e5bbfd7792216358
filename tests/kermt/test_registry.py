"""kermt.registry and the implementations keyed by its names agree both ways: every name has an implementation,
every implementation has a name, and what the registry says about a name (a metric's dataset type and direction,
a generator's width) holds when the implementation runs."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from kermt import registry
from kermt.chem.descriptors import molecule_features
from kermt.registry import GENERATOR_WIDTHS
from kermt.config import EncoderConfig
from kermt.data import splits
from kermt.data.dataset import MoleculeSet
from kermt.data.featurize import featurize_smiles
from kermt.metrics import METRICS, task_scores
from kermt.nn.encoder import BRANCHES_BY_OUTPUT_TYPE
from kermt.nn.keyed_dropout import active_draws, dropout_draws
from kermt.nn.layers import ACTIVATION_FACTORIES, make_activation
from kermt.nn.precision import autocast
from kermt.nn.pretrain.config import PretrainHeadsConfig

LABELS = {"classification": np.array([0, 1, 1, 0, 1, 0, 1, 0], dtype=float),
          "regression": np.array([0.3, -1.2, 2.5, 0.0, 1.1, -0.4, 0.8, 1.9])}


def test_every_metric_name_has_a_function_and_every_function_a_name():
    assert set(registry.METRIC_TABLE) == set(METRICS)
    assert sorted(n for names in registry.METRICS_FOR.values() for n in names) == sorted(registry.METRIC_NAMES)


@pytest.mark.parametrize("name", registry.METRIC_NAMES)
def test_a_metric_scores_its_dataset_type_in_its_declared_direction(name):
    """Close predictions beat reversed ones the way METRIC_TABLE says ("max": higher is better)."""
    dataset_type, better = registry.METRIC_TABLE[name]
    y = LABELS[dataset_type]
    close = 0.1 + 0.8 * y if dataset_type == "classification" else y + 0.1
    reversed_ = 0.9 - 0.8 * y if dataset_type == "classification" else -y
    good, bad = (task_scores(p[:, None], y[:, None], name, dataset_type)[0] for p in (close, reversed_))
    assert (good > bad) if better == "max" else (good < bad), (good, bad)
    assert registry.DEFAULT_METRIC[dataset_type] in registry.METRICS_FOR[dataset_type]


@pytest.mark.parametrize("name", registry.FEATURE_GENERATORS)
def test_every_feature_generator_computes_its_width(name):
    assert set(GENERATOR_WIDTHS) == set(registry.FEATURE_GENERATORS)
    assert molecule_features(["CC(=O)Oc1ccccc1C(=O)O"], [name]).shape == (1, GENERATOR_WIDTHS[name])


def test_every_split_type_has_its_split_function_and_every_split_function_a_type():
    functions = {name.removesuffix("_split") for name, f in inspect.getmembers(splits, inspect.isfunction)
                 if name.endswith("_split") and not name.startswith("_") and f.__module__ == splits.__name__}
    assert functions == set(registry.SPLIT_TYPES)


def test_every_activation_builds_its_module():
    assert set(ACTIVATION_FACTORIES) == set(registry.ACTIVATIONS)
    for name in registry.ACTIVATIONS:
        assert isinstance(make_activation(name), torch.nn.Module)
    with pytest.raises(ValueError, match="activation 'relu' is not one of"):
        make_activation("relu")


def test_every_precision_is_accepted_and_no_other():
    for precision in registry.PRECISIONS:
        with autocast(precision, "cpu"):
            assert torch.is_autocast_cpu_enabled() == (precision == "bf16")
    with pytest.raises(ValueError, match="precision 'fp16' is not one of"):
        autocast("fp16", "cpu")


def test_every_dropout_draw_mode_draws_as_named_and_no_other_mode_is_accepted():
    featurized = featurize_smiles(["CCO", "c1ccccc1"])
    graph = MoleculeSet(featurized.graphs, None, np.zeros((2, 1), np.float32), featurized.smiles).batch(
        np.arange(2)).graph
    for mode in registry.DROPOUT_DRAWS:
        with dropout_draws(mode, 0, 0, graph):
            assert (active_draws() is not None) == (mode == "per_molecule")
    with pytest.raises(ValueError, match="dropout_draws must be one of"), dropout_draws("numpy", 0, 0, graph):
        pass


def test_every_embedding_output_type_names_its_branches():
    assert set(BRANCHES_BY_OUTPUT_TYPE) == set(registry.EMBEDDING_OUTPUT_TYPES)
    for output_type in registry.EMBEDDING_OUTPUT_TYPES:
        for padding in registry.PADDING_MODES:
            EncoderConfig(embedding_output_type=output_type, padding=padding)


def test_every_pretrain_mode_and_positional_encoding_builds_a_heads_config():
    for mode in registry.PRETRAIN_MODES:
        for encoding in registry.POSITIONAL_ENCODINGS:
            heads = PretrainHeadsConfig(pretrain_mode=mode, atom_vocab_size=5, bond_vocab_size=5, smiles_vocab_size=9,
                                        decoder_positional_encoding=encoding)
            assert heads.uses_vocab or heads.uses_decoder
    assert PretrainHeadsConfig(atom_vocab_size=5, bond_vocab_size=5).pretrain_mode == registry.DEFAULT_PRETRAIN_MODE
    assert registry.CHECKPOINT_KINDS == ("grover_base", *registry.PRETRAIN_MODES, "finetuned")


def test_every_calibration_method_fits_and_gives_intervals_around_the_prediction():
    from kermt.uncertainty import fit_calibration, intervals

    rng = np.random.default_rng(0)
    mu, sigma = rng.normal(size=200), 0.1 + rng.random(200)
    y = mu + sigma * rng.normal(size=200)
    distance = rng.random(200)  # the applicability-domain distance mondrian_domain bins by (the others ignore it)
    for method in registry.CALIBRATION_METHODS:
        calibration = fit_calibration("t", mu, y, sigma, method=method, distance=distance)
        lower, upper = intervals(calibration, mu, sigma, 0.8, distance)
        assert calibration.method == method and np.all(lower < mu) and np.all(mu < upper), method
    with pytest.raises(Exception, match="not one of"):
        fit_calibration("t", mu, y, sigma, method="isotonic")


def test_every_classification_calibration_method_fits_and_keeps_probabilities_in_order():
    from kermt.uncertainty import fit_class_calibration

    rng = np.random.default_rng(0)
    p = rng.uniform(0.02, 0.98, size=300)
    y = (rng.random(300) < p ** 2).astype(float)  # over-confident in class 1: calibration lowers p
    for method in registry.CLASS_CALIBRATION_METHODS:
        calibration = fit_class_calibration("t", p, y, method=method)
        calibrated = calibration.calibrated(np.sort(p))
        assert calibration.method == method and np.all(np.diff(calibrated) >= -1e-12), method  # monotone
        assert calibrated.mean() < np.sort(p).mean(), method
    with pytest.raises(Exception, match="not one of|unknown|method"):
        fit_class_calibration("t", p, y, method="normalised")
