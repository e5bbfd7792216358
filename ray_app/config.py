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
"""

from __future__ import annotations

import argparse
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kermt.cli import ArgumentParser
from kermt.errors import UserError

METRICS = (
    "auc", "prc-auc", "rmse", "mae", "r2", "accuracy", "recall", "sensitivity", "specificity",
    "matthews_corrcoef", "spearmanr",
)  # fmt: skip
SPLIT_TYPES = ("random", "scaffold_balanced", "predetermined", "crossval", "index_predetermined")
FEATURE_GENERATORS = ("rdkit_2d", "rdkit_2d_normalized", "morgan", "morgan_count", "fgtasklabel")
# Upstream flags that are refused, and why. A config file may still hold the key at its only working value
# (null/false: replay files written before the removal do), which is dropped.
REMOVED_SETTINGS = {
    "undirected": "undirected message passing is not supported: upstream KERMT crashes with it at the first forward "
                  "(its node blocks index atom messages with reverse-bond indices), so no working model uses it; "
                  "remove the setting",
}


class FinetuneConfig(BaseModel):
    """Every setting of a finetune run. Field names are the flag names (``--max_lr`` <-> ``max_lr``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
    dataset_type: Optional[Literal["regression", "classification"]] = Field(
        None, description="regression or classification (default: inferred from the labels, and echoed)"
    )
    # splits, folds, seeds
    split_type: Literal[SPLIT_TYPES] = Field("random", description="how to split data_path")  # type: ignore[valid-type]
    split_sizes: tuple[float, float, float] = Field((0.8, 0.1, 0.1), description="train/val/test fractions")
    num_folds: int = Field(1, ge=1, description="folds; fold k uses seed + k")
    seed: int = Field(0, description="seed of splits, initialisation, shuffling and dynamic depth")
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
    tensorboard: bool = Field(False, description="write TensorBoard events")
    # metric and loss
    metric: Optional[Literal[METRICS]] = Field(None, description="default: auc (classification) or rmse")  # type: ignore[valid-type]
    use_mtl_loss: bool = Field(False, description="learned per-task uncertainty weights")
    show_individual_scores: bool = Field(False, description="log per-task scores")
    select_by_loss: bool = Field(False, description="select the best epoch by validation loss")
    # training schedule
    epochs: int = Field(30, ge=1)
    batch_size: int = Field(32, ge=1, description="molecules per worker per step (global batch = x num_workers)")
    warmup_epochs: float = Field(2.0, ge=0)
    init_lr: float = Field(1e-4, gt=0)
    max_lr: float = Field(1e-3, gt=0)
    final_lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    fine_tune_coff: float = Field(1.0, ge=0, description="encoder LR multiplier; 0 freezes the encoder")
    early_stop_epoch: int = Field(1000, ge=1, description="stop after this many epochs without improvement")
    ensemble_size: int = Field(1, ge=1)
    # model (architecture flags must agree with a checkpoint; they define the model when training from scratch)
    hidden_size: Optional[int] = Field(None, description="encoder width (from the checkpoint when one is given)")
    depth: Optional[int] = Field(None, description="message-passing depth")
    num_attn_head: Optional[int] = Field(None)
    num_mt_block: Optional[int] = Field(None)
    activation: Optional[Literal["ReLU", "LeakyReLU", "PReLU", "tanh", "SELU", "ELU"]] = Field(None)
    bias: Optional[bool] = Field(None)
    dropout: float = Field(0.0, ge=0, lt=1)
    self_attention: bool = Field(False, description="self-attention readout")
    attn_hidden: int = Field(4, ge=1)
    attn_out: int = Field(8, ge=1)
    ffn_hidden_size: Optional[int] = Field(None, description="default: hidden_size")
    ffn_num_layers: int = Field(2, ge=1)
    ffn_num_task_specific_layers: int = Field(0, ge=0)
    ffn_task_specific_hidden_size: Optional[int] = Field(None)
    dist_coff: float = Field(0.1, ge=0, description="weight of the disagreement term between the two views")
    bond_drop_rate: float = Field(0.0, ge=0, lt=1)
    padding: Literal["upstream", "zero"] = Field(
        "upstream", description="upstream: exact upstream numerics; zero: batch-independent molecule outputs"
    )
    # Ray
    num_workers: int = Field(1, ge=1, description="data-parallel training workers")
    use_gpu: bool = Field(False, description="one GPU per worker")
    address: Optional[str] = Field(None, description="Ray cluster (default: RAY_ADDRESS, else a local cluster)")
    max_concurrent_trials: Optional[int] = Field(
        None, ge=1, description="training runs (members, folds, trials) at once (default: what free resources allow)"
    )
    max_failures: Optional[int] = Field(
        None, ge=-1, description="lost workers/nodes a run recovers from, resuming at its last epoch checkpoint "
        "(-1: unlimited; default: 3 on a multi-node cluster, 0 on one machine)")
    storage_path: Optional[str] = Field(
        None, description="checkpoints and Tune state: s3://..., gs://..., any pyarrow URI, or file:///shared/path "
        "(default: save_dir on a single-node cluster; required on a multi-node one)")
    dry_run: bool = Field(False, description="validate and print the plan, do not train")

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
        if self.split_type == "predetermined" and (self.folds_file is None or self.test_fold_index is None):
            raise ValueError("split_type predetermined needs folds_file and test_fold_index")
        if self.split_type in ("crossval", "index_predetermined") and self.crossval_index_file is None:
            raise ValueError(f"split_type {self.split_type} needs crossval_index_file")
        if self.split_type == "crossval" and self.crossval_index_dir is None:
            raise ValueError("split_type crossval needs crossval_index_dir")
        if not self.init_lr <= self.max_lr:
            raise ValueError(f"init_lr {self.init_lr} must not exceed max_lr {self.max_lr}")
        return self


Source = Literal["user", "config", "default"]


def did_you_mean(key: str, valid: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _base_type(annotation: Any) -> Any:
    """The non-None type inside Optional[...]."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def build_parser(prog: str = "kermt finetune", schema: type[BaseModel] | None = None) -> argparse.ArgumentParser:
    """One flag per field of ``schema`` (default FinetuneConfig). Defaults are argparse.SUPPRESS so we can tell
    what the user typed."""
    schema = schema or FinetuneConfig
    parser = ArgumentParser(prog=prog, argument_default=argparse.SUPPRESS, allow_abbrev=False)
    parser.add_argument("--config", help="YAML file with the same keys as the flags; flags override it")
    for name, field in schema.model_fields.items():
        base = _base_type(field.annotation)
        help_text = field.description or ""
        origin = typing.get_origin(base)
        if base is bool:
            parser.add_argument(f"--{name}", action="store_true", help=help_text)
            parser.add_argument(f"--no-{name}", dest=name, action="store_false", help=argparse.SUPPRESS)
        elif origin is list:
            parser.add_argument(f"--{name}", nargs="*", help=help_text)
        elif origin is tuple:
            parser.add_argument(f"--{name}", nargs=len(typing.get_args(base)), type=float, help=help_text)
        elif origin is Literal:
            parser.add_argument(f"--{name}", choices=typing.get_args(base), help=help_text)
        else:
            parser.add_argument(f"--{name}", type=base, help=help_text)
    return parser


def load_yaml(path: str | Path, schema: type[BaseModel] | None = None) -> dict[str, Any]:
    schema = schema or FinetuneConfig
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as error:
        raise UserError(f"--config {path}: cannot read it ({error.strerror or error})") from error
    except yaml.YAMLError as error:
        raise UserError(f"--config {path}: not valid YAML ({' '.join(str(error).split())})") from error
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of setting -> value, got {type(data).__name__}")
    for key in [k for k in data if k in REMOVED_SETTINGS and k not in schema.model_fields]:
        if data[key] not in (None, False):
            raise UserError(f"{path}: {key}: {data[key]!r}: {REMOVED_SETTINGS[key]}")
        del data[key]
    unknown = [k for k in data if k not in schema.model_fields]
    if unknown:
        key = unknown[0]
        raise UserError(f"{path}: unknown key {key!r}{did_you_mean(key, schema.model_fields)}")
    return data


def resolve(argv: list[str] | None, schema: type[BaseModel] | None = None,
            prog: str = "kermt finetune") -> tuple[Any, dict[str, Source]]:
    """Parse flags (+ optional YAML) into a validated ``schema`` (default FinetuneConfig) and each value's source."""
    schema = schema or FinetuneConfig
    parser = build_parser(prog, schema)
    namespace, unknown = parser.parse_known_args(argv)
    flags = [u for u in unknown if u.startswith("--")]
    if unknown:
        flag = (flags or unknown)[0]
        if flag.lstrip("-").partition("=")[0] in REMOVED_SETTINGS:
            raise UserError(f"{flag}: {REMOVED_SETTINGS[flag.lstrip('-').partition('=')[0]]}")
        valid = [f"--{name}" for name in schema.model_fields] + ["--config"]
        raise UserError(f"unknown argument {flag!r}{did_you_mean(flag, valid)}")
    args = vars(namespace)
    config_path = args.pop("config", None)
    from_file = load_yaml(config_path, schema) if config_path else {}
    values = {**from_file, **args}
    try:
        config = schema(**values)
    except ValidationError as exc:
        raise UserError(_explain(exc, config_path, prog)) from None
    sources: dict[str, Source] = {}
    for name in schema.model_fields:
        sources[name] = "user" if name in args else "config" if name in from_file else "default"
    return config, sources


def _explain(exc: ValidationError, config_path: str | None, prog: str) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        origin = f" (from {config_path} or the command line)" if config_path else ""
        message = err["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
        lines.append(f"setting {where!r}{origin}: {message}" if where else message)
    return f"invalid {prog.removeprefix('kermt ')} configuration: " + "; ".join(lines)


def to_yaml(config: FinetuneConfig) -> str:
    """A YAML file that replays the run with ``kermt finetune --config``."""
    data = config.model_dump(mode="json", exclude_defaults=False)
    return yaml.safe_dump(data, sort_keys=False)
