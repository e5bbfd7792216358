"""The driver side of `kermt predict / fingerprint / embed`: check everything, stream, write, summarise.

Checks that need no cluster (checkpoints readable, feature settings consistent, columns present) run before Ray
starts, so a mistake costs a second, not a cluster start. Checkpoints are read once here and shipped to the actors
through the object store, so workers need no access to the driver's files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from kermt.checkpoint import Checkpoint, read_checkpoint
from kermt.data.feature_files import load_features_files
from kermt.errors import UserError, user_input
from kermt.inference import (Embedder, FeaturePlan, find_checkpoints, plan_features,
                             read_members, task_names)
from kermt.inference.mc_dropout import check_dropout
from kermt.inputs import check_checkpoint_file
from kermt.uncertainty import Calibration, ClassCalibration
from kermt.uncertainty.domain import DomainIndex
from ray_app.screening.config import (EmbedConfig, FingerprintConfig, ModelScreeningConfig, PredictConfig,
                                      ScreeningConfig, elapsed_line, log)
from ray_app.screening.calibration import (CalibrationFile, check_calibration_file, plan_class_calibration,
                                           plan_intervals)
from ray_app.screening.domain import DISTANCE_COLUMN, IN_DOMAIN_COLUMN, plan_domain
from ray_app.screening.stream import (CALIBRATED_SUFFIX, LOWER_SUFFIX, SET_SUFFIX, STD_SUFFIX, UPPER_SUFFIX,
                                      EmbedStage, InputSpec, PredictStage, StreamStats, build_stream, drain)
from ray_app.common.progress import Progress
from ray_app.screening.files import (
    ArraySpool,
    JsonListSpool,
    TableWriter,
    column_names,
    default_id_columns,
    pick_columns,
    row_estimate,
    untextual_columns,
    write_metadata_json,
    write_npy,
    write_npz,
)


@dataclass(frozen=True)
class Source:
    """The input as the pipeline reads it."""

    smiles_column: str
    id_columns: tuple[str, ...]


def _source(config: ScreeningConfig, output_columns: set[str] | None = None) -> Source:
    """The SMILES and id columns: ``--id_columns``; else, for a prediction file (``output_columns``: the names of
    its own columns), every other input column, as chemprop carries them; else a SMILES file's name column."""
    names = column_names(config.data_path)
    if config.id_columns is not None:
        ids = tuple(config.id_columns)
    elif output_columns is not None:
        ids = _other_columns(config.data_path, names, pick_columns(names, config.smiles_column, ()), output_columns)
    else:
        ids = default_id_columns(config.data_path)
    return Source(pick_columns(names, config.smiles_column, ids), ids)


def _other_columns(path: str, names: list[str], smiles: str, output_columns: set[str]) -> tuple[str, ...]:
    """The input's columns besides SMILES, less those the output names itself (a label column named like its
    task: the prediction takes the name) and those with no text form; a log line names what is left out."""
    untextual = set(untextual_columns(path))
    left_out = [f"{n} ({'an output column' if n in output_columns else 'not text'})" for n in names
                if n != smiles and (n in output_columns or n in untextual)]
    if left_out:
        log(f"input columns not carried to the output: {', '.join(left_out)}")
    return tuple(n for n in names if n != smiles and n not in output_columns and n not in untextual)


def _prediction_columns(tasks: tuple[str, ...] | list[str], uncertainty: bool, suffixes: tuple[str, ...] = (),
                        domain: bool = False) -> set[str]:
    """The columns a prediction file names itself (besides its SMILES column, which takes the input's name);
    ``suffixes``: those of its calibrated columns (:func:`_calibrated_suffixes`)."""
    calibrated = [t + suffix for t in tasks for suffix in suffixes]
    domain_columns = [DISTANCE_COLUMN, IN_DOMAIN_COLUMN] if domain else []
    return {"smiles", *tasks, *(t + STD_SUFFIX for t in tasks if uncertainty), *calibrated, *domain_columns, "valid",
            "error"}


def _calibrated_suffixes(config: ModelScreeningConfig, regression: bool, calibrated: bool) -> tuple[str, ...]:
    """The suffixes of the columns a calibration adds (``calibrated``: the run has one or --calibration_path)."""
    if not calibrated:
        return ()
    if regression:
        return (LOWER_SUFFIX, UPPER_SUFFIX)
    return (CALIBRATED_SUFFIX, SET_SUFFIX) if config.interval is not None else (CALIBRATED_SUFFIX,)


def _connect(config: ScreeningConfig) -> int:
    """Start/attach Ray; returns the number of model actors."""
    from ray_app.common.cluster import connect

    resources = connect(config.address)
    if config.concurrency:
        return config.concurrency
    if config.use_gpu:
        return max(1, int(resources.get("GPU", 0) // config.num_gpus_per_actor))
    return 1


def _file_features(paths: list[str] | None) -> tuple[np.ndarray, np.ndarray] | None:
    return load_features_files(paths) if paths else None


def _stream(config: ScreeningConfig, spec: InputSpec, stage: type, kwargs: dict,
            file_features: tuple[np.ndarray, np.ndarray] | None = None):
    concurrency = _connect(config)
    if file_features is not None:
        _check_row_count(config.data_path, spec, len(file_features[0]))
    kwargs = {**kwargs, "batch_size": config.batch_size, "use_gpu": config.use_gpu}
    return build_stream(config.data_path, spec, config.batch_size, stage, kwargs, concurrency,
                        config.cpus_per_actor, config.num_gpus_per_actor if config.use_gpu else 0, file_features)


def _check_row_count(data_path: str, spec: InputSpec, feature_rows: int) -> None:
    from ray_app.screening.files import read_table_lazily

    rows = read_table_lazily(data_path, [spec.smiles_column]).count()
    if rows != feature_rows:
        raise UserError(f"--features_path has {feature_rows} rows but {data_path} has {rows}; feature files need "
                        "one row per data row")


def input_progress(data_path: str, verb: str) -> Progress:
    """Progress lines for streaming ``data_path`` (an ETA where its row count is cheap to know)."""
    return Progress(f"{verb} {data_path}", total=row_estimate(data_path), unit="rows")


def _finish(stats: StreamStats, config: ScreeningConfig, started: float, commit, abort) -> int:
    if stats.valid == 0:
        abort()
        raise UserError(stats.all_invalid_message(config.data_path))
    commit()
    log(elapsed_line(stats.rows, stats.valid, started, config.output_path))
    return 0


# ---------------------------------------------------------------------------------------------------- predict


def _members(config: ModelScreeningConfig) -> list[Checkpoint]:
    paths = find_checkpoints(config.checkpoint_dir) if config.checkpoint_dir else [Path(config.checkpoint_path)]
    for path in paths:
        check_checkpoint_file(path, "--checkpoint_dir member" if config.checkpoint_dir else "--checkpoint_path")
    members = read_members(paths, trust_pickle=config.trust_checkpoint, dataset_type=config.dataset_type)
    log(f"ensemble of {len(members)} model(s): " + ", ".join(str(m.path) for m in members))
    return members


def _feature_plan(config, specs) -> tuple[FeaturePlan, tuple[np.ndarray, np.ndarray] | None]:
    file_features = _file_features(config.features_path)
    width = file_features[0].shape[1] if file_features is not None else None
    plan = plan_features(specs, config.features_generator, width)
    if plan.note:
        log(plan.note)
    return plan, file_features


@dataclass(frozen=True)
class PredictPlan:
    members: list[Checkpoint]
    features: FeaturePlan
    file_features: tuple[np.ndarray, np.ndarray] | None
    source: Source
    calibrations: dict[str, Calibration] | None = None  # --interval: each task's calibration
    domain: DomainIndex | None = None  # --applicability_domain: fold 0's index
    class_calibrations: dict[str, ClassCalibration] | None = None  # classification: each task's calibration
    calibration_file: CalibrationFile | None = None  # --calibration_path, checked (the fit waits for Ray)


def plan_predict(config: ModelScreeningConfig, carry_other_columns: bool = False) -> PredictPlan:
    """Everything predict checks before Ray starts; a ValueError here is about the input (a UserError).
    ``carry_other_columns``: without ``--id_columns``, every other input column is an id column."""
    with user_input():
        members = _members(config)
        check_dropout([m.spec for m in members], config.dropout_samples)
        if config.dropout_samples and config.interval is not None and config.calibration_path is None:
            raise UserError(f"--dropout_samples {config.dropout_samples} with --interval {config.interval}: the "
                            "calibration was fitted on the std without MC dropout, so its intervals would not hold; "
                            "drop one of the two flags")
        if config.uncertainty and len(members) == 1 and not (members[0].spec.head.variance or config.dropout_samples):
            log("warning: --uncertainty with one model writes <task>_std = 0: a spread needs an ensemble of two or "
                "more members (--checkpoint_dir), a model trained with --loss mve, or --dropout_samples N")
        classes = plan_class_calibration(config, members)  # first: it refuses a class file beside regression
        calibrations = plan_intervals(config, members)
        names = task_names(members[0].spec)
        domain = plan_domain(config, members)
        plan, file_features = _feature_plan(config, [m.spec for m in members])
        calibration_file = check_calibration_file(config, names, file_features)
        scaled = [str(m.path) for m in members if m.spec.features_scaler is not None]
        if config.no_features_scaling and scaled:
            raise UserError(f"--no_features_scaling contradicts {', '.join(scaled)}, trained with feature scaling "
                            "(its scaler is applied); drop the flag")
        suffixes = _calibrated_suffixes(config, members[0].spec.head.dataset_type == "regression",
                                        bool(calibrations or classes or calibration_file))
        source = _source(config, _prediction_columns(names, config.uncertainty, suffixes, domain is not None)
                         if carry_other_columns else None)
        clash = set(names) & set(source.id_columns) | set(names) & {source.smiles_column, "valid", "error"}
        if clash:
            raise UserError(f"id/SMILES column names {sorted(clash)} clash with the model's task names")
    return PredictPlan(members, plan, file_features, source, calibrations, domain, classes, calibration_file)


def predict_stream(config: ModelScreeningConfig, checked: PredictPlan, label_columns: tuple[str, ...] = ()):
    """The lazy dataset of prediction blocks (starts Ray); ``label_columns`` travel along as ``label::<name>``."""
    plan, source = checked.features, checked.source
    spec = InputSpec(source.smiles_column, source.id_columns, plan.generator, file_features=plan.from_file,
                     label_columns=label_columns)
    return _stream(config, spec, PredictStage, {"members": checked.members, "uncertainty": config.uncertainty,
                                                "calibrations": checked.calibrations, "interval": config.interval,
                                                "domain": checked.domain, "dropout_samples": config.dropout_samples,
                                                "class_calibrations": checked.class_calibrations},
                   checked.file_features)


def run_predict(config: PredictConfig) -> int:
    started = time.perf_counter()
    from ray_app.screening.file_calibration import calibrated_on_file  # it streams with predict_stream (below)

    checked = plan_predict(config, carry_other_columns=not config.drop_extra_columns)
    writer = TableWriter(config.output_path)
    checked = calibrated_on_file(config, checked)
    ds = predict_stream(config, checked)

    def write(block: pa.Table) -> None:
        writer.write(block.rename_columns([checked.source.smiles_column, *block.column_names[1:]]))

    stats = drain(ds, write, input_progress(config.data_path, "predicting"))
    return _finish(stats, config, started, writer.commit, writer.abort)


# ------------------------------------------------------------------------------------------ fingerprint / embed


def _embedding_checkpoint(config: FingerprintConfig | EmbedConfig) -> Checkpoint:
    check_checkpoint_file(config.checkpoint_path, "--checkpoint_path")
    with user_input():
        checkpoint = read_checkpoint(config.checkpoint_path, trust_pickle=config.trust_checkpoint,
                                     dataset_type=config.dataset_type)
    log(f"{checkpoint.path}: {checkpoint.spec.kind} checkpoint")
    return checkpoint


def run_fingerprint(config: FingerprintConfig) -> int:
    started = time.perf_counter()
    checkpoint = _embedding_checkpoint(config)
    with user_input():
        embedder = Embedder(checkpoint)
        families = config.fingerprint_source or embedder.default_source
        embedder.check_source(families)  # fail before the cluster starts
    if config.fingerprint_source is None:
        log(f"fingerprint_source {families} (the default for a {checkpoint.spec.kind} checkpoint)")
    file_features = _file_features(config.features_path)
    if config.features_generator is None and file_features is None:
        generator: tuple[str, ...] = ()  # upstream appends molecule features only when asked
    else:
        generator = tuple(config.features_generator or ())
    source = _source(config)
    spec = InputSpec(source.smiles_column, (), generator, file_features=file_features is not None)
    ds = _stream(config, spec, EmbedStage, {"checkpoint": checkpoint, "fingerprint_source": families},
                 file_features)
    output = Path(config.output_path)
    spools: dict[str, ArraySpool] = {}

    def write(block: pa.Table) -> None:
        fps = block.column("fps")
        if not spools:
            spools["fps"] = ArraySpool(fps.type.list_size)
            spools["valid"] = ArraySpool(1, np.bool_)
        spools["fps"].append(fps.combine_chunks().flatten().to_numpy())
        spools["valid"].append(block.column("valid").to_numpy(zero_copy_only=False))

    stats = drain(ds, write, input_progress(config.data_path, "fingerprinting"))
    return _finish(stats, config, started, lambda: write_npz(output, spools), lambda: None)


def run_embed(config: EmbedConfig) -> int:
    started = time.perf_counter()
    checkpoint = _embedding_checkpoint(config)
    source = _source(config)
    spec = InputSpec(source.smiles_column, source.id_columns, canonical=True)
    output = Path(config.output_path)
    if output.suffix.lower() in (".csv", ".npy", ".npz"):
        raise UserError(f"output_path {output}: embed writes a .parquet file or a directory of .npy files")
    ds = _stream(config, spec, EmbedStage, {"checkpoint": checkpoint, "fingerprint_source": None})
    progress = input_progress(config.data_path, "embedding")
    if output.suffix.lower() == ".parquet":
        writer = TableWriter(output)
        return _finish(drain(ds, writer.write, progress), config, started, writer.commit, writer.abort)
    writer = NpyDirectoryWriter(output, {"checkpoint": str(checkpoint.path), "kind": checkpoint.spec.kind})
    return _finish(drain(ds, writer.write, progress), config, started, writer.commit, lambda: None)


class NpyDirectoryWriter:
    """Upstream's ``extract_embeddings`` npy layout: ``<family>.npy`` [N, width] per output + ``metadata.json``."""

    LISTS = ("smiles", "canonical_smiles", "valid")

    def __init__(self, directory: Path, header: dict) -> None:
        self.directory, self.header = directory, header
        self.arrays: dict[str, ArraySpool] = {}
        self.lists = {name: JsonListSpool() for name in self.LISTS}

    def write(self, block: pa.Table) -> None:
        for name in block.column_names:
            column = block.column(name)
            if pa.types.is_fixed_size_list(column.type):
                spool = self.arrays.setdefault(name, ArraySpool(column.type.list_size))
                spool.append(column.combine_chunks().flatten().to_numpy())
        for name, spool in self.lists.items():
            spool.extend(block.column(name).to_pylist())

    def commit(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, spool in self.arrays.items():
            write_npy(self.directory / f"{name}.npy", spool)
        rows = next(iter(self.arrays.values())).rows if self.arrays else 0
        header = {**self.header, "n_molecules": rows, "embedding_types": list(self.arrays),
                  "widths": {name: spool.width for name, spool in self.arrays.items()}}
        write_metadata_json(self.directory / "metadata.json", header, self.lists)


__all__ = ["NpyDirectoryWriter", "PredictPlan", "plan_predict", "predict_stream", "run_embed",
           "run_fingerprint", "run_predict"]
