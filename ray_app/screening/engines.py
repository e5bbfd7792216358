"""Which engine computes a screening command, and its output blocks from either (docs/screening.md#engines).

``--engine auto`` (the default) runs a small local input in this process (:mod:`ray_app.screening.local`) and the
rest on Ray Data (:mod:`ray_app.screening.stream`); both run the same stages on the same blocks of rows, so they
write the same files.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kermt.errors import UserError
from ray_app.common.storage import is_uri
from ray_app.screening.config import (LOCAL_MAX_ROWS, EmbedConfig, FingerprintConfig, ModelScreeningConfig, log)
from ray_app.screening.files import InputTable, filesystem_of, row_estimate
from ray_app.screening.local import count_rows, local_stream
from ray_app.screening.stream import InputSpec, PredictStage, blocks_of, build_stream, connect_actors

if TYPE_CHECKING:
    from ray_app.screening.plan import PredictPlan

StreamedConfig = ModelScreeningConfig | FingerprintConfig | EmbedConfig
# a compressed file's row count is not known without reading it: assume a row per this many compressed bytes (a
# compressed SMILES line is rarely shorter), so the guess errs towards Ray
COMPRESSED_BYTES_PER_ROW = 10


def resolve_engine(config: StreamedConfig, paths: Sequence[str | None] = ()) -> StreamedConfig:
    """``config`` with ``engine`` "local" or "ray": the flag as given, or for ``auto`` the in-process path when no
    cluster is named or running, every input is a local file and the data has at most LOCAL_MAX_ROWS rows.
    ``paths``: other inputs the command streams (``--calibration_path``)."""
    if config.engine == "local":
        _check_local(config)
        return config
    if config.engine == "ray":
        return config
    engine = auto_engine(config.data_path, config.address, config.concurrency, paths)
    return config.model_copy(update={"engine": engine})


def auto_engine(data_path: str, address: str | None, concurrency: int | None = None,
                paths: Sequence[str | None] = ()) -> str:
    """``--engine auto``'s choice for ``data_path`` (and the other inputs ``paths``), logged with its reason."""
    why_ray = _why_ray(data_path, address, concurrency, [data_path, *paths])
    engine = "ray" if why_ray else "local"
    log(f"engine: {engine} ({why_ray or 'a small local input, no cluster named or running'}; --engine "
        f"{'local' if why_ray else 'ray'} to choose the other)")
    return engine


def _check_local(config: StreamedConfig) -> None:
    for flag, value in (("--address", config.address), ("--concurrency", config.concurrency)):
        if value is not None:
            raise UserError(f"{flag} {value} is for --engine ray; --engine local computes in this process")


def _why_ray(data_path: str, address: str | None, concurrency: int | None,
             paths: Sequence[str | None]) -> str | None:
    """Why ``auto`` streams on Ray (None: it runs in-process)."""
    if address or os.environ.get("RAY_ADDRESS"):
        return f"a cluster is named ({address or 'RAY_ADDRESS'})"
    if _joined_a_cluster():
        return "this process is connected to a Ray cluster"
    if concurrency is not None:
        return f"--concurrency {concurrency} asks for model actors"
    remote = [p for p in paths if p is not None and is_uri(p)]
    if remote:
        return f"{remote[0]} is read where it is, by Ray Data"
    rows = _rows_at_most(data_path)
    if rows > LOCAL_MAX_ROWS:
        return f"{data_path} has more than {LOCAL_MAX_ROWS:,} rows"
    return None


def _joined_a_cluster() -> bool:
    """Whether this process is connected to a Ray cluster it did not start itself. A local cluster that an earlier
    step of this process started (kermt explore's surrogate finetune) is no reason to stream a small input there:
    the in-process path is faster and the answer the same."""
    ray = sys.modules.get("ray")  # never imported for this: a process that has not imported Ray runs no cluster
    if ray is None or not ray.is_initialized():
        return False
    from ray_app.common.cluster import started_here  # Ray is imported already: no cost

    return not started_here()


def _rows_at_most(path: str) -> int:
    filesystem, inner = filesystem_of(path)  # a missing file is the input check's one-line error, here too
    rows = row_estimate(path)
    if rows is not None:
        return rows
    return filesystem.get_file_info(inner).size // COMPRESSED_BYTES_PER_ROW


def start_stream(config: StreamedConfig, table: InputTable, spec: InputSpec, stage: type, kwargs: dict,
                 file_features: tuple[np.ndarray, np.ndarray] | None = None) -> Iterator[pa.Table]:
    """The output blocks of ``stage`` over ``table``, in input order: computed in this process (``--engine
    local``) or streamed on Ray (which this connects to). ``config.engine`` is resolved (not "auto")."""
    kwargs = {**kwargs, "batch_size": config.batch_size, "use_gpu": config.use_gpu}
    if config.engine == "local":
        if file_features is not None:
            _check_row_count(table, count_rows(table, spec.smiles_column), len(file_features[0]))
        return local_stream(table, spec, config.batch_size, stage, kwargs, file_features,
                            threads=max(1, int(config.cpus_per_actor)))
    concurrency = connect_actors(config)
    if file_features is not None:
        from ray_app.screening.files import read_table_lazily

        _check_row_count(table, read_table_lazily(table, [spec.smiles_column]).count(), len(file_features[0]))
    ds = build_stream(table, spec, config.batch_size, stage, kwargs, concurrency,
                      config.cpus_per_actor, config.num_gpus_per_actor if config.use_gpu else 0, file_features)
    return blocks_of(ds)





def _check_row_count(table: InputTable, rows: int, feature_rows: int) -> None:
    if rows != feature_rows:
        raise UserError(f"--features_path has {feature_rows} rows but {table.path} has {rows}; feature files need "
                        "one row per data row")


def predict_stream(config: ModelScreeningConfig, checked: PredictPlan, label_columns: tuple[str, ...] = ()):
    """The prediction blocks (:func:`start_stream`); ``label_columns`` travel along as ``label::<name>``."""
    plan, source = checked.features, checked.source
    spec = InputSpec(source.smiles_column, source.id_columns, plan.generator, file_features=plan.from_file,
                     label_columns=label_columns, prep=plan.prep(config.max_heavy_atoms))
    return start_stream(config, source.table, spec, PredictStage, predict_stage_kwargs(config, checked),
                        checked.file_features)


def predict_stage_kwargs(config: ModelScreeningConfig, checked: PredictPlan) -> dict:
    """PredictStage's arguments for ``checked`` (less the batch size and the device, which start_stream adds)."""
    return {"members": checked.members, "outputs": checked.outputs(config), "domain": checked.domain,
            "dropout_samples": config.dropout_samples, **config.width_kwargs()}


__all__ = ["COMPRESSED_BYTES_PER_ROW", "StreamedConfig", "auto_engine", "predict_stage_kwargs", "predict_stream",
           "resolve_engine", "start_stream"]
