"""A round's surrogate: a `kermt finetune` on everything scored so far (``DIR/round_k``), then its prediction of
the whole library with mean and standard deviation (``DIR/round_k/library_predictions.parquet``, one row per
library row, in order: `kermt predict --uncertainty`'s file).

The driver reads the predictions back one block of rows at a time (:func:`prediction_blocks`, for
:func:`kermt.explore.blocks.acquire_in_blocks`), never the whole file.

Both steps are skipped when their files are there: a resumed exploration reuses a finished surrogate and its
predictions (the finetune itself resumes a surrogate that stopped mid-training).
"""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kermt.data.atomic_files import write_text
from kermt.errors import UserError
from kermt.explore.acquisition import Surrogate
from kermt.explore.explored import Explored
from kermt.inference.columns import STD_SUFFIX
from kermt.run_layout import ROUND_LOGS, RunLayout
from ray_app.explore.config import TRAINING_SCORE, TRAINING_SMILES, ExploreConfig
from ray_app.explore.library import Library, featurised_library


def train_surrogate(config: ExploreConfig, layout: RunLayout, round_index: int, explored: Explored) -> Path:
    """Round ``round_index``'s surrogate, trained on the scored rows of ``explored`` (earlier rounds); its
    save_dir. Its output goes to ``round_k/finetune.log``, not the console (the round line says where)."""
    from ray_app.finetune.run import run_finetune

    directory = layout.round(round_index)
    if RunLayout(directory).run_record.exists():
        return directory
    scored = explored.select(np.flatnonzero(explored.scored))
    text = io.StringIO()
    rows = csv.writer(text, lineterminator="\n")  # quotes a SMILES only where it must (a comma, a quote)
    rows.writerow([TRAINING_SMILES, TRAINING_SCORE])
    rows.writerows(zip(scored.smiles, scored.score.tolist()))
    training = layout.round_training(round_index)
    write_text(str(training), text.getvalue())
    previous = previous_members(config, layout, round_index)
    finetune = config.surrogate(round_index, str(training), str(directory), previous[0] if previous else None)
    sources = {name: "user" for name in type(finetune).model_fields}
    with open(directory / ROUND_LOGS["finetune"], "a") as log, contextlib.redirect_stdout(log):
        if len(previous) == config.ensemble_size:  # member k from the previous round's member k
            finetune = finetune.with_member_checkpoints(previous)
        elif previous:
            print(f"warm start: the previous round saved {len(previous)} member(s) for an ensemble of "
                  f"{config.ensemble_size}; every member starts from its first, {previous[0]}", flush=True)
        run_finetune(finetune, sources)
    return directory


def previous_members(config: ExploreConfig, layout: RunLayout, round_index: int) -> tuple[str, ...]:
    """--warm_start: the previous round's members in member order, where this round's start (none: round 1, or
    no warm start). Member k starts from member k when the counts match; else each from the first."""
    if not config.warm_start or round_index < 2:
        return ()
    from kermt.inference import find_checkpoints

    return tuple(str(p) for p in find_checkpoints(layout.round(round_index - 1)))


def predict_library(config: ExploreConfig, layout: RunLayout, round_index: int, library: Library) -> Path:
    """The file of the round's surrogate's mean and std for every library row (NaN where a SMILES is invalid),
    predicted from the library featurised once (``DIR/library/``, written by the first round that predicts)."""
    from ray_app.screening.config import PredictConfig
    from ray_app.screening.engines import auto_engine
    from ray_app.screening.run import run_predict

    path = layout.round_predictions(round_index)
    if not path.exists():
        # its lines (the engine, one model's zero spread) go to the round's log: the round line is the news
        with open(layout.round(round_index) / ROUND_LOGS["predict"], "a") as log, contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log):
            # --engine auto's choice, logged once: featurising the library (round 1) and predicting it share it
            engine = auto_engine(config.library, config.address)
            predict = PredictConfig(data_path=config.library, smiles_column=library.smiles_column,
                                    checkpoint_dir=str(layout.round(round_index)), output_path=str(path),
                                    uncertainty=True, drop_extra_columns=True, address=config.address,
                                    max_heavy_atoms=config.max_heavy_atoms, use_gpu=config.use_gpu, engine=engine)
            shards = featurised_library(config, layout, library, predict.batch_size, engine)
            run_predict(predict, shards)
    return path


# predicted rows held at once while the acquisition reads a round's predictions (16 bytes a row)
PREDICTION_ROWS = 65_536


def prediction_blocks(path: Path, rows: int, block_rows: int = PREDICTION_ROWS) -> Iterator[tuple[int, Surrogate]]:
    """(first row, mean and std of the block's rows) of a predictions file of ``rows`` rows, in order, a block of
    at most ``block_rows`` rows at a time. One model's std is 0: read, never used (the settings refuse the
    acquisitions that would use it)."""
    # no pre-buffering: it reads every row group's columns ahead, the whole file's mean and std (16 bytes a row)
    with pq.ParquetFile(path, pre_buffer=False) as handle:
        if handle.metadata.num_rows != rows:
            raise UserError(f"{path} holds {handle.metadata.num_rows:,} predictions for a library of {rows:,} rows; "
                            "delete it and resume to predict the library again")
        start = 0
        for batch in handle.iter_batches(batch_size=block_rows, columns=[TRAINING_SCORE, TRAINING_SCORE + STD_SUFFIX]):
            yield start, Surrogate(_floats(batch.column(0)), _floats(batch.column(1)))
            start += batch.num_rows


def _floats(column: pa.Array) -> np.ndarray:
    return column.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls (invalid rows) become NaN


__all__ = ["PREDICTION_ROWS", "prediction_blocks", "predict_library", "previous_members", "train_surrogate"]
