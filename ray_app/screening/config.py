"""Settings of `kermt predict`, `eval`, `fingerprint`, `embed` and `reconstruct`: streaming screening on Ray Data.

Flags are upstream's (``main.py predict`` / ``main.py fingerprint``) plus the Ray ones; the same keys work in
``--config FILE.yaml``. Everything the checkpoint decides (architecture, tasks, scalers, feature generator) comes
from the checkpoint; a feature flag that contradicts it is an error naming what the checkpoint expects.

Outputs keep one row per input row, in input order: predictions (CSV in upstream's layout, SMILES then task
columns, or Parquet) with the id columns (by default the input's other columns) and ``valid``/``error`` appended;
fingerprints as ``.npz`` (key ``fps`` as upstream, plus ``valid``); embeddings as Parquet or a directory of
``.npy`` files + ``metadata.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from kermt.names import level_not_percentage
from kermt.presets import PREDICT_BATCH_SIZE, UPSTREAM_REFERENCE_WIDTH
from kermt.registry import FEATURE_GENERATORS, DatasetType, FingerprintSource, Metric
from ray_app.common.molecule_flags import max_heavy_atoms_field
from ray_app.common.settings import did_you_mean


class ScreeningConfig(BaseModel):
    """Settings shared by the three screening commands."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_path: str = Field(description="CSV (also .csv.gz/.bz2/.zst), Parquet or SMILES file (.smi, .cxsmiles: "
                           "SMILES then a name) (local path or URI)")
    output_path: str = Field(description="output file (suffix decides the format)")
    smiles_column: Optional[str] = Field(None, description="SMILES column (default: the first column)")
    id_columns: Optional[list[str]] = Field(None, description="columns copied to the output (as text; default: "
                                            "kermt predict every other column, else a SMILES file's name column)")
    batch_size: int = Field(PREDICT_BATCH_SIZE, ge=1,
                            description="molecules per model batch (no number depends on it, except with "
                            "--upstream_batching: docs/numerics.md)")
    max_heavy_atoms: int = max_heavy_atoms_field()
    trust_checkpoint: bool = Field(False, description="allow full unpickling of checkpoints (runs their code)")
    dataset_type: Optional[DatasetType] = Field(
        None, description="only for an upstream finetuned checkpoint that stores neither its dataset type nor "
        "target statistics (a checkpoint that stores it decides; a different value is an error)")
    address: Optional[str] = Field(None, description="Ray cluster (default: RAY_ADDRESS, else a local cluster)")
    use_gpu: bool = Field(False, description="run the model actors on GPUs")
    num_gpus_per_actor: float = Field(1.0, gt=0, description="GPUs per model actor with --use_gpu (fractions ok)")
    cpus_per_actor: float = Field(1.0, gt=0, description="CPUs reserved per model actor")
    concurrency: Optional[int] = Field(None, ge=1, description="model actors (default: 1, or one per GPU)")


class FeatureFlags(BaseModel):
    """Molecule features given for prediction (default: the checkpoint's own generator)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    features_generator: Optional[list[str]] = Field(None, description=f"molecule features: {FEATURE_GENERATORS}")
    features_path: Optional[list[str]] = Field(None, description=".npz feature files, one row per data row")

    @model_validator(mode="after")
    def _check_features(self):
        for name in self.features_generator or ():
            if name not in FEATURE_GENERATORS:
                raise ValueError(f"unknown features_generator {name!r}{did_you_mean(name, FEATURE_GENERATORS)}")
        if self.features_generator is not None and self.features_path:
            raise ValueError("features_generator and features_path cannot be combined")
        return self


class WidthFlags(BaseModel):
    """Which neighbour width each molecule is computed at (kermt.inference.widths): by default a molecule's number
    depends on the molecule and the model only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    upstream_batching: bool = Field(False, description="upstream's batch-dependent numbers, for parity with "
                                    "upstream's outputs: each batch of --batch_size consecutive rows collated at "
                                    "its largest atom degree (upstream padding only; docs/numerics.md)")
    reference_width: Optional[int] = Field(None, ge=1, description="neighbour width W an upstream-padded model "
                                           "computes each molecule at (at least; its own largest degree when "
                                           "larger); default: the one the model records, else "
                                           f"{UPSTREAM_REFERENCE_WIDTH} (docs/numerics.md)")

    def width_kwargs(self) -> dict:
        """The model stages' keywords for these flags."""
        return {"upstream_batching": self.upstream_batching, "reference_width": self.reference_width}


# --engine auto computes inputs of up to this many rows in this process. Measured by bench/predict.py (2 cores, the
# fixture classifier, docs/screening.md#engines): in-process 15.3 s at 20,000 rows, Ray's start-up alone 10-15 s;
# above, Ray's featurisation on every core of a larger machine wins.
LOCAL_MAX_ROWS = 20_000


class EngineFlag(BaseModel):
    """Where the molecules are computed (:mod:`ray_app.screening.local`, docs/screening.md#engines)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["auto", "local", "ray"] = Field(
        "auto", description="local: in this process, without Ray; ray: a Ray Data stream on a local or named "
        f"cluster; auto: local for a local input of up to {LOCAL_MAX_ROWS:,} rows when no cluster is named "
        "(--address, RAY_ADDRESS) and no --concurrency is given, else ray. Both write the same files")


class ModelScreeningConfig(EngineFlag, WidthFlags, FeatureFlags, ScreeningConfig):
    """`kermt predict` and `kermt eval`: a finetuned model or an ensemble of them."""

    checkpoint_dir: Optional[str] = Field(None, description="ensemble: every best model under this directory")
    checkpoint_path: Optional[str] = Field(None, description="one model (.pt or native directory)")
    uncertainty: bool = Field(False, description="add <task>_std columns: standard deviation over the members "
                              "(with --loss mve models or --dropout_samples, the total std; docs/uncertainty.md)")
    dropout_samples: int = Field(0, ge=0, description="MC dropout: average N forward passes of each member with its "
                                 "dropout layers on (masks seeded per molecule: the same numbers every time); their "
                                 "spread joins <task>_std. Needs a model trained with --dropout > 0")
    interval: Annotated[Optional[float], BeforeValidator(level_not_percentage)] = Field(
        None, gt=0, lt=1, description="add <task>_lower/<task>_upper (regression) "
        "or <task>_set (classification): conformal intervals / prediction sets at "
        "this level (e.g. 0.9) from the run's calibration or --calibration_path "
        "(docs/uncertainty.md)")
    calibration_path: Optional[str] = Field(None, description="recalibrate on your own labelled molecules: a CSV/"
                                            "Parquet with a SMILES column (--smiles_column, else the first) and a "
                                            "label column per task; its predictions replace the run's calibration "
                                            "for --interval and <task>_calibrated")
    calibration_features_path: Optional[list[str]] = Field(None, description=".npz features of --calibration_path, "
                                                           "one row per row (needed when --features_path is given)")
    applicability_domain: bool = Field(False, description="add domain_distance (mean distance to the 5 nearest "
                                       "training molecules in the model's embedding) and in_domain (as close as "
                                       "95 percent of the validation molecules were), from the run's "
                                       "fold_k/domain.json (docs/uncertainty.md)")
    no_features_scaling: bool = Field(False, description="upstream's flag, accepted so its commands port: the "
                                      "checkpoint decides; an error if a member was trained with feature scaling")
    attributions: bool = Field(False, description="add <task>_atoms (a JSON list: each heavy atom's share of the "
                               "prediction, in the atom order of the SMILES the model saw), <task>_baseline (the "
                               "value the shares start from) and, for a model with molecule descriptors, "
                               "<task>_descriptors; a classifier's shares explain its logit; kermt eval writes "
                               "them to <stem>_attributions.csv beside --output_path (docs/attributions.md)")

    @model_validator(mode="after")
    def _one_source(self) -> "ModelScreeningConfig":
        if (self.checkpoint_dir is None) == (self.checkpoint_path is None):
            raise ValueError("give exactly one of checkpoint_dir and checkpoint_path")
        return self


class PredictConfig(ModelScreeningConfig):
    drop_extra_columns: bool = Field(False, description="write only the SMILES, predictions, valid and error "
                                     "(and --id_columns); by default every other input column is carried too")


class EvalConfig(ModelScreeningConfig):
    """`kermt eval`: PredictConfig plus the labels and the metric; ``output_path`` is upstream's test_result.csv."""

    output_path: str = Field(description="test_result.csv in upstream's layout: SMILES, preds per task, targets")
    target_columns: Optional[list[str]] = Field(None, description="label columns, one per task in the model's "
                                                "order (default: the columns named like the model's tasks)")
    metric: Optional[Metric] = Field(None, description="default: auc (classification) or rmse")
    show_individual_scores: bool = Field(False, description="also print the score of each task")


class FingerprintConfig(EngineFlag, WidthFlags, FeatureFlags, ScreeningConfig):
    checkpoint_path: str = Field(description="pretrained or finetuned checkpoint (.pt or native directory)")
    fingerprint_source: Optional[FingerprintSource] = Field(
        None, description="embedding families to pool (default: both; atom for a finetuned model, which has no "
        "trained bond-output branches, so bond and both are refused for it)")


class EmbedConfig(EngineFlag, WidthFlags, ScreeningConfig):
    checkpoint_path: str = Field(description="pretrained or finetuned checkpoint (.pt or native directory)")


class ReconstructConfig(ScreeningConfig):
    """`kermt reconstruct`: SMILES generated from each molecule's latent (upstream task/reconstruct.py's flags)."""

    checkpoint_path: str = Field(description="cmim or hybrid pretraining checkpoint (.pt or native directory)")
    smiles_vocab_path: Optional[str] = Field(None, description="SMILES vocab the model was pretrained with (upstream "
                                             ".pkl or our .json; default: the *smiles_vocab.json/.pkl next to the "
                                             "checkpoint)")
    use_mean: bool = Field(False, description="condition on the latent mean instead of samples from q(z|x)")
    num_samples: int = Field(1, ge=1, description="SMILES generated per molecule (output rows per input row)")
    max_len: Optional[int] = Field(None, ge=2, description="longest sequence, <start> included (default: the "
                                   "decoder's decoder_max_seq_len)")
    temperature: float = Field(1.0, ge=0, description="sampling temperature; 0 = greedy decoding")
    top_k: Optional[int] = Field(None, ge=1, description="sample among the k most likely tokens (1 = greedy)")
    top_p: Optional[float] = Field(None, gt=0, le=1, description="nucleus sampling: the most likely tokens "
                                   "holding probability p")
    seed: int = Field(0, ge=0, description="sample k of input row r depends only on (seed, r, k)")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def elapsed_line(rows: int, valid: int, started: float, output: str | Path) -> str:
    seconds = time.perf_counter() - started
    return (f"wrote {rows} rows ({valid} valid, {rows - valid} invalid) to {output} in {seconds:.1f} s "
            f"({rows / max(seconds, 1e-9):.0f} molecules/s)")


__all__ = ["LOCAL_MAX_ROWS", "EmbedConfig", "EngineFlag", "EvalConfig", "FingerprintConfig", "ModelScreeningConfig",
           "PredictConfig", "ReconstructConfig", "ScreeningConfig", "WidthFlags", "elapsed_line", "log"]
