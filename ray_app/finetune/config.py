"""Run configuration for `kermt finetune`: one typed pydantic model, fed by flags, a YAML file and defaults.

Flag names and defaults are upstream KERMT's (`main.py finetune`), so an upstream command line works after
replacing ``python main.py`` with ``kermt``. The same keys are valid in ``--config FILE.yaml``; flags given on the
command line override the file. Every resolved value remembers where it came from (user, config, default) so
``run.json`` can say so.

Deliberate differences from upstream:
- ``--dataset_type`` has no silent "classification" default: it is given, or inferred from the labels.
- ``--early_stop_epoch`` is implemented (patience in epochs without improvement).
- Architecture flags given next to a checkpoint must agree with it; training settings are never overridden by it.
- ``--undirected`` is not offered (see :data:`REMOVED_SETTINGS`).
- Without a checkpoint, the settings the user leaves unset take the from-scratch recipe's values
  (``kermt.presets.FROM_SCRATCH_TRAINING``: descriptors in the head, more epochs at a higher learning rate), and
  the architecture is ``kermt.presets.FROM_SCRATCH``; upstream's defaults are for finetuning a pretrained encoder.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from kermt.config import HeadConfig
from kermt.names import did_you_mean
from kermt.presets import FROM_SCRATCH, FROM_SCRATCH_TRAINING, UPSTREAM_FINETUNE
from kermt.registry import (
    FEATURE_GENERATORS,
    FINETUNE_STANDARDIZATION,
    Activation,
    CalibrationMethod,
    ClassCalibrationMethod,
    DEFAULT_CALIBRATION_METHOD,
    DEFAULT_CLASS_CALIBRATION_METHOD,
    DatasetType,
    DropoutDraws,
    FinetuneLoss,
    Metric,
    PaddingMode,
    Precision,
    SplitType,
    Standardization,
)
from ray_app.common import settings
from ray_app.common.data_parallel import DataParallelSettings
from ray_app.common.molecule_flags import max_heavy_atoms_field
from ray_app.common.settings import Source

# Defaults of upstream main.py finetune's parser: kermt.presets (architecture flags default to None: the checkpoint's,
# or FROM_SCRATCH's without one, ray_app/finetune/run_setup.py).
_ENCODER, _READOUT, _TRAINING = UPSTREAM_FINETUNE.encoder, UPSTREAM_FINETUNE.readout, UPSTREAM_FINETUNE.training


class FinetuneConfig(DataParallelSettings):
    """Every setting of a finetune run. Field names are the flag names (``--max_lr`` <-> ``max_lr``)."""

    # what a run without a checkpoint fills in instead of the flags' defaults (_from_scratch_recipe); --help says so
    OTHER_DEFAULTS: ClassVar[tuple[str, dict[str, Any]]] = ("without a checkpoint", {
        **{k: getattr(FROM_SCRATCH, k) for k in ("hidden_size", "depth", "num_attn_head")},
        **FROM_SCRATCH_TRAINING.settings()})
    # how messages name the flag that sets split_sizes: kermt explore's surrogates get theirs from its
    # --validation_share (with_split_flag), so a surrogate's "validation split too small" names that flag
    _split_flag: str = PrivateAttr("--split_sizes")

    @property
    def split_flag(self) -> str:
        return self._split_flag

    def with_split_flag(self, flag: str) -> "FinetuneConfig":
        self._split_flag = flag
        return self

    # kermt explore --warm_start: member m starts from _member_checkpoints[m] (the previous round's member m, so the
    # ensemble keeps its spread) instead of checkpoint_path, which names the first of them (the architecture)
    _member_checkpoints: tuple[str, ...] = PrivateAttr(())

    @property
    def member_checkpoints(self) -> tuple[str, ...]:
        return self._member_checkpoints

    def with_member_checkpoints(self, paths: tuple[str, ...]) -> "FinetuneConfig":
        self._member_checkpoints = tuple(paths)
        return self

    # data
    data_path: str = Field(description="CSV (also .csv.gz/.bz2/.zst) or Parquet with a SMILES column and targets")
    smiles_column: Optional[str] = Field(None, description="SMILES column (default: the first column)")
    target_columns: Optional[list[str]] = Field(None, description="targets (default: every other column)")
    separate_val_path: Optional[str] = Field(None, description="validation file (no split for val)")
    separate_test_path: Optional[str] = Field(None, description="test file (no split for test)")
    features_generator: Optional[list[str]] = Field(None, description=f"molecule features: {FEATURE_GENERATORS}")
    features_path: Optional[list[str]] = Field(None, description=".npz feature files (key 'features')")
    separate_val_features_path: Optional[list[str]] = Field(None, description=".npz features of the val file")
    separate_test_features_path: Optional[list[str]] = Field(None, description=".npz features of the test file")
    no_features_scaling: bool = Field(False, description="do not standardise molecule features")
    max_data_size: Optional[int] = Field(None, description="read at most this many rows per file")
    on_invalid: Literal["skip", "error"] = Field("skip", description="invalid SMILES: skip (logged) or error")
    max_heavy_atoms: int = max_heavy_atoms_field()
    standardize: Standardization = Field(
        FINETUNE_STANDARDIZATION, description="how molecules are standardised before featurisation, recorded in the "
        "model and applied by every prediction with it: parent (RDKit rdMolStandardize: the largest organic "
        "fragment, neutralised where possible, so a salt is its parent) or none (the molecule as written, as "
        "upstream; the splits use the input SMILES either way)")
    dataset_type: Optional[DatasetType] = Field(
        None, description="regression or classification (default: inferred from the labels, and echoed)"
    )
    # splits, folds, seeds
    split_type: SplitType = Field("random", description="how to split data_path")
    split_sizes: tuple[float, float, float] = Field((0.8, 0.1, 0.1), description="train/val/test fractions")
    num_folds: int = Field(1, ge=1, description="folds; fold k uses seed + k")
    seed: int = Field(_TRAINING.seed, description="seed of splits, initialisation, shuffling and dynamic depth")
    folds_file: Optional[str] = Field(None, description="predetermined: JSON list of index lists")
    val_fold_index: Optional[int] = Field(None, description="predetermined: fold used for validation")
    test_fold_index: Optional[int] = Field(None, description="predetermined: fold used for test")
    crossval_index_dir: Optional[str] = Field(None, description="crossval: directory of index files")
    crossval_index_file: Optional[str] = Field(None, description="crossval/index_predetermined: JSON index file")
    # checkpoint and outputs
    checkpoint_path: Optional[str] = Field(None, description="pretrained or finetuned checkpoint (.pt or native dir)")
    pretrained_release: bool = Field(False, description="start from nvidia/NV-KERMT-70M-v2 (downloaded)")
    model_dir: Optional[str] = Field(None, description="where --pretrained_release stores the model")
    trust_checkpoint: bool = Field(False, description="allow full unpickling of the checkpoint (runs its code)")
    save_dir: str = Field("runs/finetune", description="output directory")
    overwrite: bool = Field(False, description="start over in save_dir: delete what an earlier run left there "
                            "(default: resume it if its settings are the same, else move it to save_dir/earlier_runs)")
    tensorboard: bool = Field(False, description="write TensorBoard events")
    # metric and loss
    metric: Optional[Metric] = Field(None, description="default: auc (classification) or rmse")
    use_mtl_loss: bool = Field(False, description="learned per-task uncertainty weights")
    loss: FinetuneLoss = Field(
        "mse", description="mse: upstream's loss (squared error; BCE for classification); mve (regression): the head "
        "also predicts a variance per task, trained with the Gaussian NLL; <task>_std and calibration use it "
        "(docs/uncertainty.md#estimators)")
    show_individual_scores: bool = Field(False, description="log per-task scores")
    select_by_loss: bool = Field(False, description="select the best epoch by validation loss")
    calibration_method: CalibrationMethod = Field(
        DEFAULT_CALIBRATION_METHOD, description="how each fold's regression intervals are calibrated (on its "
        "validation split, or --calibration_path): normalised (adapt per molecule), mondrian (normalised, coverage "
        "within sigma bins), mondrian_domain (normalised, coverage within bins of the applicability-domain "
        "distance: wider far from the training set), plain (one width), zscaling (Gaussian, for NLL; no "
        "guarantee); one model per fold always uses plain (unless --loss mve)")
    class_calibration_method: ClassCalibrationMethod = Field(
        DEFAULT_CLASS_CALIBRATION_METHOD, description="how each fold's classification probabilities are recalibrated: "
        "platt (two numbers, needs few molecules) or isotonic (a monotone step function, a few hundred molecules or "
        "more); the conformal sets are the same either way")
    calibration_path: Optional[str] = Field(
        None, description="calibrate every fold's ensemble on this labelled file (SMILES + the run's task columns) "
        "instead of its validation split; its molecules should be ones the model never trained on (a line counts "
        "those also in a fold's training split); changing only this (or the calibration methods) on a finished run "
        "recalibrates its models without training them again")
    calibration_features_path: Optional[list[str]] = Field(
        None, description=".npz features of the calibration file (needed with --features_path)")
    # training schedule (epochs, batch sizes, learning rates: DataParallelSettings)
    fine_tune_coff: float = Field(_TRAINING.fine_tune_coff, ge=0, description="encoder LR multiplier; 0 freezes the "
                                  "encoder")
    early_stop_epoch: int = Field(1000, ge=1, description="stop after this many epochs without improvement")
    ensemble_size: int = Field(_TRAINING.ensemble_size, ge=1, description="models per fold, trained concurrently; "
                               "predictions are their mean")
    # model (architecture flags must agree with a checkpoint; they define the model when training from scratch)
    hidden_size: Optional[int] = Field(None, description="encoder width (from the checkpoint when one is given)")
    depth: Optional[int] = Field(None, description="message-passing depth")
    num_attn_head: Optional[int] = Field(None, description="attention heads per transformer block")
    num_mt_block: Optional[int] = Field(None, description="multi-head transformer blocks")
    activation: Optional[Activation] = Field(None, description="activation function")
    bias: Optional[bool] = Field(None, description="linear layers with a bias term")
    dropout: float = Field(_ENCODER.dropout, ge=0, lt=1, description="dropout probability (encoder and FFN head)")
    self_attention: bool = Field(_READOUT.self_attention, description="self-attention readout")
    attn_hidden: int = Field(_READOUT.attn_hidden, ge=1, description="self-attention readout: hidden size")
    attn_out: int = Field(_READOUT.attn_out, ge=1, description="self-attention readout: outputs (readout width "
                          "attn_out x hidden_size)")
    ffn_hidden_size: Optional[int] = Field(None, description="default: hidden_size")
    ffn_num_layers: int = Field(HeadConfig.ffn_num_layers, ge=1, description="layers of the FFN head")
    ffn_num_task_specific_layers: int = Field(HeadConfig.ffn_num_task_specific_layers, ge=0,
                                              description="task-specific FFN layers after the shared ones")
    ffn_task_specific_hidden_size: Optional[int] = Field(
        None, description="width of the task-specific FFN layers (needed when there are any)")
    features_ffn: bool = Field(HeadConfig.features_ffn, description="molecule features also feed an FFN of their "
                               "own whose output is added to the prediction, so that they can carry the model "
                               "alone (needs features; no upstream counterpart)")
    dist_coff: float = Field(_TRAINING.dist_coff, ge=0, description="weight of the disagreement term between the two "
                             "views")
    bond_drop_rate: float = Field(_TRAINING.bond_drop_rate, ge=0, lt=1, description="bond dropout probability in "
                                  "training")
    dropout_draws: DropoutDraws = Field(
        "per_molecule", description="dropout masks drawn per molecule from (seed, step, molecule): N workers equal "
        "1, also after an elastic restart; torch: torch's RNG per worker, upstream's masks")
    precision: Precision = Field(
        "fp32", description="bf16: forward passes under bfloat16 autocast (neighbour sums, loss and weights stay "
        "float32); see docs/numerics.md for how far outputs move")
    padding: Optional[PaddingMode] = Field(
        None, description="upstream: upstream's numerics (each molecule then computed at the model's reference "
        "width); zero: the padding row takes no part in any sum (default: the checkpoint's, zero from scratch; "
        "docs/numerics.md#padding-modes)")
    # Ray (num_workers, use_gpu, address, max_failures, storage_path: DataParallelSettings)
    max_concurrent_trials: Optional[int] = Field(
        None, ge=1, description="training runs (members, folds, trials) at once (default: what free resources allow)"
    )
    dry_run: bool = Field(False, description="read and check the inputs, print the settings and the plan; no Ray, no "
                          "training (resources are checked when the run starts)")

    @model_validator(mode="before")
    @classmethod
    def _from_scratch_recipe(cls, values: Any) -> Any:
        """Without a checkpoint, what the user leaves unset takes the from-scratch recipe's value
        (kermt.presets.FROM_SCRATCH_TRAINING); no descriptors are added to a run given --features_path, and
        ``--features_generator`` with no names asks for none."""
        if not isinstance(values, dict) or values.get("checkpoint_path") or values.get("pretrained_release"):
            return values
        recipe = FROM_SCRATCH_TRAINING.settings()
        if values.get("features_path"):
            del recipe["features_generator"]
        return {**recipe, **values}

    @model_validator(mode="after")
    def _check(self) -> "FinetuneConfig":
        if abs(sum(self.split_sizes) - 1.0) > 1e-6:
            raise ValueError(f"split_sizes must sum to 1, got {list(self.split_sizes)}")
        if self.pretrained_release and self.checkpoint_path:
            raise ValueError("pretrained_release and checkpoint_path conflict: give one of them")
        for name in self.features_generator or ():
            if name not in FEATURE_GENERATORS:
                raise ValueError(f"unknown features_generator {name!r}{did_you_mean(name, FEATURE_GENERATORS)}")
        if self.features_generator and self.features_path:
            raise ValueError("features_generator and features_path cannot be combined (as upstream)")
        if self.calibration_features_path and not self.calibration_path:
            raise ValueError("calibration_features_path needs calibration_path (the file its rows describe)")
        if self.features_path and self.calibration_path and not self.calibration_features_path:
            raise ValueError("calibration_path with features_path needs calibration_features_path: the .npz "
                             "features of the calibration file's molecules")
        if self.split_type == "predetermined" and (self.folds_file is None or self.test_fold_index is None):
            raise ValueError("split_type predetermined needs folds_file and test_fold_index")
        if self.split_type in ("crossval", "index_predetermined") and self.crossval_index_file is None:
            raise ValueError(f"split_type {self.split_type} needs crossval_index_file")
        if self.split_type == "crossval" and self.crossval_index_dir is None:
            raise ValueError("split_type crossval needs crossval_index_dir")
        return self


# Settings that decide only the calibration fitted after the members are trained (ray_app.finetune.calibrate): a
# re-run with only these changed keeps the trained members and calibrates them again.
CALIBRATION_SETTINGS = ("calibration_method", "class_calibration_method", "calibration_path",
                        "calibration_features_path")
# Settings that may change when a run is resumed in the same save_dir (a finetune's unfinished members, a sweep's
# trials): they do not change what is trained. (`kermt tune` refuses overwrite, so there it never changes.)
RESUMABLE_CHANGES = ("address", "max_concurrent_trials", "dry_run", "storage_path", "max_failures",
                     "tensorboard", "show_individual_scores", "trust_checkpoint", "overwrite", *CALIBRATION_SETTINGS)


def resolve(argv: list[str] | None, schema: type[BaseModel] = FinetuneConfig,
            prog: str = "kermt finetune") -> tuple[Any, dict[str, Source]]:
    """:func:`ray_app.common.settings.resolve` with finetune's schema as the default."""
    return settings.resolve(argv, schema, prog)
