"""`kermt explore`'s rounds: a random first batch (round 0), then per round k = 1..--iterations: a surrogate
trained on everything scored so far, its prediction of the unexplored library, the next batch by the acquisition
function, scored by the objective and recorded in ``DIR/explored.csv`` (kermt.explore.explored) before the next
round starts.

Resuming: the same command on the same ``--save_dir`` goes on from the first round explored.csv does not hold
(``--iterations`` may grow; any other setting must be the one the exploration started with, or it is refused:
an exploration's scores are never moved aside). Every choice is a pure function of the seed, the round and what was
scored before it, so a resumed exploration acquires what an uninterrupted one would. `--acquisition random` trains
no surrogate.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from kermt.data.atomic_files import write_text
from kermt.errors import Interrupted, UserError
from kermt.explore.acquisition import best_score, round_rng
from kermt.explore.blocks import acquire_in_blocks, random_rows
from kermt.explore.explored import Explored, append_round, read_explored
from kermt.explore.scorers import Scores
from kermt.explore.sizes import check_plan
from kermt.run_layout import RunLayout
from ray_app.common.settings import to_yaml
from ray_app.explore.config import ExploreConfig
from ray_app.explore.library import Library, batch_smiles, open_library, write_lookup_scores
from ray_app.explore.objectives import Scorer, make_scorer

# Settings that may change when an exploration resumes: they change where and how long it runs, not its choices
# (save_dir: an exploration's folder may be moved or copied).
RESUMABLE_CHANGES = ("iterations", "save_dir", "address", "max_concurrent_trials", "storage_path", "max_failures",
                     "tensorboard", "show_individual_scores", "trust_checkpoint", "objective_timeout",
                     "objective_cpus", "objective_batch_size")


def run_explore(config: ExploreConfig) -> Explored:
    """Every round not yet in ``--save_dir``; returns the explored molecules."""
    layout = RunLayout(Path(config.save_dir))
    library = open_library(config.library, config.library_smiles_column)
    explored = _resume(config, layout)
    init, acquire = config.batch_sizes()
    check_plan(init, acquire, config.iterations, library.rows, len(explored))
    scorer = make_scorer(config.objective_spec(), config.objective_timeout, config.objective_cpus,
                         config.objective_batch_size, config.address)
    write_lookup_scores(config.objective_spec(), layout, library)
    if explored.rounds_done:
        print(f"resuming {config.save_dir} at round {explored.rounds_done} ({len(explored):,} molecules explored)",
              flush=True)
    for round_index in range(explored.rounds_done, config.iterations + 1):
        started = time.perf_counter()
        size = (init if round_index == 0 else acquire).molecules(library.rows)
        try:
            batch = _scored(acquire_batch(config, layout, library, explored, round_index, size), scorer)
        except KeyboardInterrupt as stop:  # Ctrl-C, or a finetune's graceful stop
            kept = f"{layout.explored} keeps rounds 0 to {round_index - 1}" if round_index else "nothing was scored"
            raise Interrupted(f"{kept}; the same command resumes at round {round_index}") from stop
        append_round(str(layout.explored), batch)  # the round is kept before the next one starts
        explored = explored.extended(batch)
        print(round_line(config, explored, round_index, time.perf_counter() - started), flush=True)
        write_round_report(layout)
    return explored


def write_round_report(layout: RunLayout) -> None:
    """``DIR/report.html`` of the rounds so far; a report that cannot be built is a line, never the round's
    failure (explored.csv holds what matters, and `kermt report DIR` rebuilds it)."""
    from ray_app.report.build import report_of_finished_run

    report_of_finished_run(layout.root)


def acquire_batch(config: ExploreConfig, layout: RunLayout, library: Library, explored: Explored, round_index: int,
                  size: int) -> Explored:
    """Round ``round_index``'s ``size`` molecules, unscored: random in round 0 (and with --acquisition random),
    else the acquisition function's best on the round's surrogate, chosen over its predictions one block at a time
    (kermt.explore.blocks): the driver holds no array of the library's size."""
    from ray_app.explore.surrogate import predict_library, prediction_blocks, train_surrogate  # Ray, torch

    explored_rows = np.unique(explored.library_row)
    rng = round_rng(config.seed, round_index)
    if round_index == 0 or config.acquisition == "random":
        rows = random_rows(explored_rows, library.rows, size, rng)
        nan = np.full(len(rows), math.nan)
        return _batch(layout, library, rows, round_index, nan, nan, nan)
    train_surrogate(config, layout, round_index, explored)
    predictions = predict_library(config, layout, round_index, library)
    chosen = acquire_in_blocks(config.acquisition, prediction_blocks(predictions, library.rows), explored_rows, size,
                               best_score(explored.score, config.minimize), rng, beta=config.beta,
                               minimize=config.minimize)
    return _batch(layout, library, chosen.rows, round_index, chosen.mean, chosen.std, chosen.values)


def _batch(layout: RunLayout, library: Library, rows: np.ndarray, round_index: int, mean: np.ndarray,
           std: np.ndarray, values: np.ndarray) -> Explored:
    n = len(rows)
    return Explored(batch_smiles(layout, library, rows), np.full(n, math.nan), np.full(n, round_index, dtype=np.int64),
                    np.asarray(mean, np.float64), np.asarray(std, np.float64), np.asarray(values, np.float64),
                    np.asarray(rows, np.int64), [""] * n)


def _scored(batch: Explored, scorer: Scorer) -> Explored:
    scores: Scores = scorer(batch.smiles) if len(batch) else Scores(np.zeros(0), [])
    batch.score, batch.error = scores.values, list(scores.errors)
    return batch


def round_line(config: ExploreConfig, explored: Explored, round_index: int, seconds: float) -> str:
    """``round 2: 20 scored (1 failed), batch best 3.21, best so far 3.85 (120 scored), 41.0 s``."""
    this = explored.round == round_index
    failed = int(np.count_nonzero(this & ~explored.scored))
    batch_best = best_score(explored.score[this], config.minimize)
    return (f"round {round_index}: {int(this.sum()):,} scored" + (f" ({failed} failed)" if failed else "") +
            f", batch best {batch_best:.4g}, best so far {best_score(explored.score, config.minimize):.4g} "
            f"({int(explored.scored.sum()):,} scored), {seconds:.1f} s")


def _resume(config: ExploreConfig, layout: RunLayout) -> Explored:
    """What an earlier run of this exploration recorded (nothing for a new one); its settings must be these."""
    recorded = _settings_record(config)
    if layout.explore_settings.exists():
        earlier = yaml.safe_load(layout.explore_settings.read_text()) or {}
        changed = [k for k in recorded if earlier.get(k) != recorded[k]]
        if changed:
            key = changed[0]
            raise UserError(f"{config.save_dir} holds an exploration with other settings (--{key} was "
                            f"{earlier.get(key)!r}, now {recorded[key]!r}); run it with its settings to resume "
                            "it, or give another --save_dir")
    elif layout.explored.exists():
        raise UserError(f"{layout.explored} exists without {layout.explore_settings.name}; give another --save_dir")
    else:
        write_text(str(layout.explore_settings), yaml.safe_dump(recorded, sort_keys=False))
    return read_explored(str(layout.explored)) if layout.explored.exists() else Explored()


def _settings_record(config: ExploreConfig) -> dict[str, Any]:
    data = yaml.safe_load(to_yaml(config))
    return {k: v for k, v in data.items() if k not in RESUMABLE_CHANGES}


__all__ = ["RESUMABLE_CHANGES", "acquire_batch", "round_line", "run_explore", "write_round_report"]
