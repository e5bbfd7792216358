"""Every closed set of names a setting can take (metrics, feature generators, split types, activations, ...),
each spelled once, in the order ``--help`` lists them.

Pure Python: settings, flag parsers and input checks read it without importing torch, RDKit or sklearn. Where
typing wants a ``Literal``, the tuple is read off it (``get_args``), so the two cannot drift. A set whose members
have implementations elsewhere is declared here and the implementations are keyed by these names (named in each
comment); tests/kermt/test_registry.py checks that every name has one and every implementation has a name.
"""

from __future__ import annotations

from typing import Literal, get_args

# What a finetuned model predicts.
DatasetType = Literal["regression", "classification"]
DATASET_TYPES: tuple[str, ...] = get_args(DatasetType)

# Metrics: name -> (the dataset type it scores, whether lower or higher values are better). A new metric is one
# line here plus its function in kermt.metrics.METRICS. A metric of the other dataset type is refused before
# anything runs (kermt.metric_names.resolve_metric), as upstream's parsing does.
MetricDirection = Literal["min", "max"]
METRIC_TABLE: dict[str, tuple[DatasetType, MetricDirection]] = {
    "auc": ("classification", "max"),
    "prc-auc": ("classification", "max"),
    "accuracy": ("classification", "max"),
    "recall": ("classification", "max"),
    "sensitivity": ("classification", "max"),
    "specificity": ("classification", "max"),
    "matthews_corrcoef": ("classification", "max"),
    "rmse": ("regression", "min"),
    "mae": ("regression", "min"),
    "r2": ("regression", "max"),
    "spearmanr": ("regression", "max"),
}
METRIC_NAMES: tuple[str, ...] = tuple(METRIC_TABLE)
Metric = Literal[METRIC_NAMES]  # type: ignore[valid-type]  # built from the table: a type checker cannot see it
METRICS_FOR: dict[str, tuple[str, ...]] = {
    kind: tuple(name for name, (scores, _) in METRIC_TABLE.items() if scores == kind) for kind in DATASET_TYPES
}
LOWER_IS_BETTER: frozenset[str] = frozenset(name for name, (_, better) in METRIC_TABLE.items() if better == "min")
DEFAULT_METRIC: dict[str, str] = {"classification": "auc", "regression": "rmse"}  # upstream's defaults

# Molecule-level feature generators, upstream's names, and the width of each. Implementations: kermt.chem.descriptors
# (whose import costs descriptastorus and SciPy: a model's feature width is checked without them).
FeatureGenerator = Literal["rdkit_2d", "rdkit_2d_normalized", "morgan", "morgan_count", "fgtasklabel"]
FEATURE_GENERATORS: tuple[str, ...] = get_args(FeatureGenerator)
GENERATOR_WIDTHS: dict[str, int] = {"rdkit_2d": 200, "rdkit_2d_normalized": 200, "fgtasklabel": 85, "morgan": 2048,
                                    "morgan_count": 2048}

# Conformal calibration methods of regression intervals. Implementations: kermt.uncertainty.conformal.
CalibrationMethod = Literal["normalised", "plain", "mondrian", "zscaling", "mondrian_domain"]
CALIBRATION_METHODS: tuple[str, ...] = get_args(CalibrationMethod)
DEFAULT_CALIBRATION_METHOD: CalibrationMethod = "normalised"  # here, not in the implementation: settings read it

# Recalibration methods of classification probabilities. Implementations: kermt.uncertainty.classification.
ClassCalibrationMethod = Literal["platt", "isotonic"]
CLASS_CALIBRATION_METHODS: tuple[str, ...] = get_args(ClassCalibrationMethod)
DEFAULT_CLASS_CALIBRATION_METHOD: ClassCalibrationMethod = "platt"

# Finetune training losses (kermt.train.losses, chosen by the model's head: HeadConfig.variance). "mse" is upstream's
# (squared error for regression, BCE for classification); "mve" (regression only) gives the head a variance per task
# beside the mean and trains both with the Gaussian negative log-likelihood (mean-variance estimation).
FinetuneLoss = Literal["mse", "mve"]
FINETUNE_LOSSES: tuple[str, ...] = get_args(FinetuneLoss)

# How `kermt finetune` splits its data (kermt.data.splits, chosen in ray_app.finetune.prepare).
SplitType = Literal["random", "scaffold_balanced", "predetermined", "crossval", "index_predetermined"]
SPLIT_TYPES: tuple[str, ...] = get_args(SplitType)

# Activations of the encoder and heads, upstream's names. Implementations: kermt.nn.layers.ACTIVATION_FACTORIES.
Activation = Literal["ReLU", "LeakyReLU", "PReLU", "tanh", "SELU", "ELU"]
ACTIVATIONS: tuple[str, ...] = get_args(Activation)

# Forward-pass precision (kermt.nn.precision.autocast).
Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)

# Where dropout masks come from: per molecule from (seed, step, molecule), or torch's RNG (kermt.nn.keyed_dropout).
DropoutDraws = Literal["per_molecule", "torch"]
DROPOUT_DRAWS: tuple[str, ...] = get_args(DropoutDraws)

# How the encoder treats the padding row 0 (kermt.config.EncoderConfig, docs/numerics.md#padding-modes).
PaddingMode = Literal["upstream", "zero"]
PADDING_MODES: tuple[str, ...] = get_args(PaddingMode)

# How molecules are standardised before featurisation (kermt.chem.standardize): parent = RDKit rdMolStandardize's
# largest organic fragment, neutralised where possible; none = the input molecule as parsed (upstream).
Standardization = Literal["parent", "none"]
STANDARDIZATIONS: tuple[str, ...] = get_args(Standardization)
FINETUNE_STANDARDIZATION: Standardization = "parent"  # every new finetune (from scratch or from a checkpoint)
UNRECORDED_STANDARDIZATION: Standardization = "none"  # a checkpoint that records none: upstream's, or older ones
# Heavy atoms above which a molecule is an invalid row, decided from its SMILES: more than any small-molecule drug
# (vancomycin has 101, cyclosporin 85; MOSES and the upstream fixtures stay under 40), few enough that one molecule
# cannot stall a batch or a serve replica. Here, not in kermt.chem, so that settings load without RDKit.
DEFAULT_MAX_HEAVY_ATOMS = 200

# How `kermt explore` picks the next batch of a library (kermt.explore.acquisition.ACQUISITION_FUNCTIONS): the
# surrogate's mean (greedy), mean plus --beta standard deviations (ucb), expected or probable improvement over the
# best score found (ei, pi), one draw from each molecule's predictive distribution (thompson), or none (random).
Acquisition = Literal["greedy", "ucb", "ei", "pi", "thompson", "random"]
ACQUISITIONS: tuple[str, ...] = get_args(Acquisition)
# the acquisitions that read the surrogate's uncertainty: refused before any work with a surrogate that has none
UNCERTAIN_ACQUISITIONS: frozenset[str] = frozenset({"ucb", "ei", "pi", "thompson"})

# Which encoder output families are built / pooled into a fingerprint (keys of
# kermt.nn.encoder.BRANCHES_BY_OUTPUT_TYPE); a fingerprint's --fingerprint_source takes the same names.
EmbeddingOutputType = Literal["atom", "bond", "both"]
EMBEDDING_OUTPUT_TYPES: tuple[str, ...] = get_args(EmbeddingOutputType)
FingerprintSource = EmbeddingOutputType

# Pretraining objectives (kermt.nn.pretrain). The default is upstream pretrain_ddp.py's, which `kermt pretrain`
# offers and documents; the library's PretrainHeadsConfig uses the same one.
PretrainMode = Literal["vocab", "cmim", "hybrid"]
PRETRAIN_MODES: tuple[str, ...] = get_args(PretrainMode)
DEFAULT_PRETRAIN_MODE: PretrainMode = "vocab"

# Positions of the cMIM SMILES decoder (kermt.nn.pretrain.decoder_layers).
PositionalEncoding = Literal["rope", "sinusoidal"]
POSITIONAL_ENCODINGS: tuple[str, ...] = get_args(PositionalEncoding)

# What a checkpoint holds (kermt.checkpoint.spec): a bare encoder, a pretraining model of one of the modes, or a
# finetuned model.
CheckpointKind = Literal["grover_base", PretrainMode, "finetuned"]
CHECKPOINT_KINDS: tuple[str, ...] = get_args(CheckpointKind)
PRETRAIN_KINDS: tuple[str, ...] = ("grover_base", *PRETRAIN_MODES)

__all__ = [
    "ACQUISITIONS", "ACTIVATIONS", "CALIBRATION_METHODS", "CHECKPOINT_KINDS", "CLASS_CALIBRATION_METHODS",
    "DATASET_TYPES",
    "DEFAULT_MAX_HEAVY_ATOMS", "DEFAULT_METRIC", "DEFAULT_PRETRAIN_MODE", "DROPOUT_DRAWS", "FINETUNE_STANDARDIZATION",
    "UNRECORDED_STANDARDIZATION",
    "EMBEDDING_OUTPUT_TYPES", "FEATURE_GENERATORS", "FINETUNE_LOSSES", "LOWER_IS_BETTER", "METRICS_FOR",
    "METRIC_NAMES", "METRIC_TABLE",
    "PADDING_MODES", "POSITIONAL_ENCODINGS", "PRECISIONS", "PRETRAIN_KINDS", "PRETRAIN_MODES", "SPLIT_TYPES",
    "STANDARDIZATIONS", "UNCERTAIN_ACQUISITIONS",
    "Acquisition", "Activation", "CalibrationMethod", "CheckpointKind", "ClassCalibrationMethod", "DatasetType",
    "DropoutDraws",
    "EmbeddingOutputType", "FeatureGenerator",
    "FinetuneLoss", "FingerprintSource", "Metric", "MetricDirection", "PaddingMode", "PositionalEncoding", "Precision",
    "PretrainMode", "SplitType", "Standardization",
]
