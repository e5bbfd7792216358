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
    why_ray = _why_ray(config, [config.data_path, *paths])
    engine = "ray" if why_ray else "local"
    log(f"engine: {engine} ({why_ray or 'a small local input, no cluster named or running'}; --engine "
        f"{'local' if why_ray else 'ray'} to choose the other)")
    return config.model_copy(update={"engine": engine})


def _check_local(config: StreamedConfig) -> None:
    for flag, value in (("--address", config.address), ("--concurrency", config.concurrency)):
        if value is not None:
            raise UserError(f"{flag} {value} is for --engine ray; --engine local computes in this process")


def _why_ray(config: StreamedConfig, paths: Sequence[str | None]) -> str | None:
    """Why ``auto`` streams on Ray (None: it runs in-process)."""
    if config.address or os.environ.get("RAY_ADDRESS"):
        return f"a cluster is named ({config.address or 'RAY_ADDRESS'})"
    if _ray_is_running_here():
        return "this process is connected to a Ray cluster"
    if config.concurrency is not None:
        return f"--concurrency {config.concurrency} asks for model actors"
    remote = [p for p in paths if p is not None and is_uri(p)]
    if remote:
        return f"{remote[0]} is read where it is, by Ray Data"
    rows = _rows_at_most(config.data_path)
    if rows > LOCAL_MAX_ROWS:
        return f"{config.data_path} has more than {LOCAL_MAX_ROWS:,} rows"
    return None


def _ray_is_running_here() -> bool:
    ray = sys.modules.get("ray")  # never imported for this: a process that has not imported Ray runs no cluster
    return ray is not None and ray.is_initialized()


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
    stage_kwargs = {"members": checked.members, "outputs": checked.outputs(config), "domain": checked.domain,
                    "dropout_samples": config.dropout_samples, **config.width_kwargs()}
    return start_stream(config, source.table, spec, PredictStage, stage_kwargs, checked.file_features)


__all__ = ["COMPRESSED_BYTES_PER_ROW", "StreamedConfig", "predict_stream", "resolve_engine", "start_stream"]
