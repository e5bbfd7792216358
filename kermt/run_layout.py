"""The names of a run's files and folders: the one place that spells them, for the commands that write them
(``ray_app``) and every reader (the report, ``kermt predict``/``serve``, :mod:`kermt.inference.members`).

A finetune's ``save_dir``::

    run_state.json  config.yaml  splits.json  invalid_smiles.csv  run.json  report.html  ray_results/
    earlier_runs/<run id>/                  what an earlier run with other settings left (ray_app.finetune.resume)
    fold_k/  test_result.csv  test_spread.csv  calibration.json  classification_calibration.json
             domain.json  domain_embeddings.safetensors
    fold_k/model_m/  model/ (native)  model.pt (upstream)  metrics.csv (written last)

A pretraining run's ``save_dir`` has run_state.json, config.yaml, run.json, report.html, ray_results/, metrics.csv,
model/, model.pt and, beside the model, its vocabularies and corpus record. A ``kermt tune`` sweep's has
tune_config.yaml, all_trials.csv, sweep.json, best_config.yaml, best_model/, ``trials/<trial id>/`` (config.yaml,
metrics.csv), report.html and its Ray Tune experiment, tune/ (unless --storage_path). A new finetune or tune run of
other settings, or of the other kind, moves what a run left to earlier_runs/<run id>/
(:meth:`RunLayout.earlier_run_outputs`). A member's or a trial's directory names its own files as a run does
(:class:`RunLayout` of it).

Plain names and path arithmetic only, so that importing this costs nothing (no torch, no Ray).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUN_STATE_FILE = "run_state.json"  # a run's id and settings, written when the run starts
RUN_CONFIG_FILE = "config.yaml"  # the settings as given, replayable with --config
RUN_RECORD_FILE = "run.json"  # written when the run has finished (a finetune's summary names its run id)
SPLITS_FILE = "splits.json"  # each fold's split, by row index
INVALID_SMILES_FILE = "invalid_smiles.csv"  # the input rows that did not parse, with why
REPORT_FILE = "report.html"  # the run's report (ray_app.report), rebuilt from the other files by `kermt report`
STORAGE_DIR = "ray_results"  # the run's Ray storage (checkpoints, Tune experiments) when --storage_path is not given
EARLIER_RUNS_DIR = "earlier_runs"  # an earlier run's outputs, moved aside by a new run with other settings
METRICS_FILE = "metrics.csv"  # one row per epoch (finetune member, trial) or interval (pretraining)
COMPLETE_MEMBER_FILE = METRICS_FILE  # the file a finetune member writes last: a member without it is incomplete
MODEL_DIR = "model"  # a model in the native format (kermt.checkpoint.native)
UPSTREAM_MODEL_FILE = "model.pt"  # the same model in upstream's layout
CHECKPOINT_STATE_FILE = "training_state.pt"  # in a Ray step/epoch checkpoint: the optimizer state and progress

FOLD_PREFIX = "fold"  # fold_k/
MEMBER_PREFIX = "model"  # fold_k/model_m/
TEST_RESULT_FILE = "test_result.csv"  # fold_k/: the ensemble's test predictions, in upstream's layout
TEST_SPREAD_FILE = "test_spread.csv"  # fold_k/: the members' spread on each test molecule (the report's intervals)
CALIBRATION_FILE = "calibration.json"  # fold_k/: the fold ensemble's conformal calibration (kermt.uncertainty)
CLASS_CALIBRATION_FILE = "classification_calibration.json"  # fold_k/: Platt/isotonic + set scores
DOMAIN_FILE = "domain.json"  # fold_k/: the applicability domain's settings and threshold (kermt.uncertainty.domain)
DOMAIN_ARRAYS_FILE = "domain_embeddings.safetensors"  # fold_k/: its training embeddings
# run.json's calibration record of a fold calibrated on a --calibration_path file (only then): how many of its
# molecules are also in the fold's training split
IN_TRAINING_SPLIT_KEY = "in_training_split"

SWEEP_FILE = "tune_config.yaml"  # a `kermt tune` save_dir: its trials are candidates, not an ensemble
ALL_TRIALS_FILE = "all_trials.csv"  # a sweep's trials, one row each
SWEEP_RECORD_FILE = "sweep.json"  # a sweep's summary (best trial, counts, wall time)
BEST_CONFIG_FILE = "best_config.yaml"  # the best trial's settings, a `kermt finetune --config`
TRIALS_DIR = "trials"  # trials/<trial id>/
BEST_MODEL_DIR = "best_model"  # the best trial's model (native)
BEST_REPLAY_DIR = "best_replay"  # best_config.yaml's --save_dir: where replaying the best trial writes
TUNE_EXPERIMENT_DIR = "tune"  # a sweep's Ray Tune experiment, in its save_dir unless --storage_path names another root

# A `kermt explore` save_dir: its settings (to resume only with the same ones), the molecules it scored and each
# round's surrogate, a finetune run of its own (round_k/, with the file it trained on and its library predictions)
EXPLORE_SETTINGS_FILE = "explore_config.yaml"
EXPLORED_FILE = "explored.csv"  # every acquired molecule, its score and round (kermt.explore.explored)
# explored.csv's length in bytes and rows of its whole rounds: readers stop there, an append first cuts back to it
EXPLORED_RECORD_FILE = "explored.rounds.json"
# a lookup objective's score of every library row (NaN: none), written once by the exploration: the report's exact
# random baseline reads it, so the report never reads the library itself (ray_app.report imports no explore code)
EXPLORE_LOOKUP_SCORES_FILE = "library_lookup_scores.npy"
ROUND_PREFIX = "round"  # round_k/: the surrogate trained before acquiring round k's batch
ROUND_TRAINING_FILE = "scored.csv"  # round_k/: smiles,score of everything scored before round k
ROUND_PREDICTIONS_FILE = "library_predictions.parquet"  # round_k/: the surrogate's mean and std per library row
ROUND_LOGS = {"finetune": "finetune.log", "predict": "predict.log"}  # round_k/: what each step printed
EXPLORE_LIBRARY_DIR = "library"  # the library featurised once, the shards every round's prediction reads

# Beside a pretrained model: the release's file names (ray_app/common/release.py); our SMILES vocab is JSON where
# the release's is a pickle.
MODEL_VOCAB_FILES = {"atom": "pretrain_atom_vocab.json", "bond": "pretrain_bond_vocab.json",
                     "smiles": "pretrain_smiles_vocab.json"}
CORPUS_RECORD_FILE = "pretrain_corpus.json"  # the corpus the model saw


# What kermt predict and eval write beside --output_path, named <stem><suffix> (beside_output)
REPORT_SUFFIX = "_report.html"  # the scored file's report
UNCERTAINTY_SCORES_SUFFIX = "_uncertainty.json"  # interval (and set) scores on the labelled rows
DOMAIN_SCORES_SUFFIX = "_domain.json"  # the applicability domain's share of in-domain rows and distances
ATTRIBUTIONS_FILE_SUFFIX = "_attributions.csv"  # kermt eval --attributions: predict's file of the labelled input
BESIDE_OUTPUT_SUFFIXES = (REPORT_SUFFIX, UNCERTAINTY_SCORES_SUFFIX, DOMAIN_SCORES_SUFFIX, ATTRIBUTIONS_FILE_SUFFIX)


def beside_output(output: Path, suffix: str) -> Path:
    """``<stem><suffix>`` in the folder of ``output`` (kermt predict/eval's --output_path)."""
    return output.with_name(output.stem + suffix)


def fold_name(fold: int) -> str:
    """``fold_k``: a fold's directory, and its key in run.json and splits.json."""
    return f"{FOLD_PREFIX}_{fold}"


def numbered(directory: Path, prefix: str) -> list[tuple[int, Path]]:
    """The ``prefix_0, prefix_1, ...`` directories under ``directory`` in numeric order (fold_10 after fold_9)."""
    found = []
    for child in directory.glob(f"{prefix}_*") if directory.is_dir() else ():
        match = re.fullmatch(rf"{re.escape(prefix)}_(\d+)", child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


@dataclass(frozen=True)
class RunLayout:
    """Where each file of the run in ``root`` (its save_dir) lives."""

    root: Path

    @property
    def run_state(self) -> Path:
        return self.root / RUN_STATE_FILE

    @property
    def config(self) -> Path:
        return self.root / RUN_CONFIG_FILE

    @property
    def run_record(self) -> Path:
        return self.root / RUN_RECORD_FILE

    @property
    def splits(self) -> Path:
        return self.root / SPLITS_FILE

    @property
    def invalid_smiles(self) -> Path:
        return self.root / INVALID_SMILES_FILE

    @property
    def report(self) -> Path:
        return self.root / REPORT_FILE

    @property
    def storage(self) -> Path:
        return self.root / STORAGE_DIR

    @property
    def earlier_runs(self) -> Path:
        return self.root / EARLIER_RUNS_DIR

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def model(self) -> Path:
        return self.root / MODEL_DIR

    @property
    def upstream_model(self) -> Path:
        return self.root / UPSTREAM_MODEL_FILE

    @property
    def corpus_record(self) -> Path:
        return self.root / CORPUS_RECORD_FILE

    def fold(self, fold: int) -> Path:
        return self.root / fold_name(fold)

    def member(self, fold: int, member: int) -> Path:
        """``fold_k/model_m/``: one ensemble member's model/, model.pt and metrics.csv."""
        return self.fold(fold) / f"{MEMBER_PREFIX}_{member}"

    def folds(self) -> list[tuple[int, Path]]:
        """The fold directories present, (k, fold_k/) in numeric order."""
        return numbered(self.root, FOLD_PREFIX)

    def test_result(self, fold: int) -> Path:
        return self.fold(fold) / TEST_RESULT_FILE

    def test_spread(self, fold: int) -> Path:
        return self.fold(fold) / TEST_SPREAD_FILE

    def calibration(self, fold: int) -> Path:
        return self.fold(fold) / CALIBRATION_FILE

    def class_calibration(self, fold: int) -> Path:
        return self.fold(fold) / CLASS_CALIBRATION_FILE

    def domain(self, fold: int) -> Path:
        return self.fold(fold) / DOMAIN_FILE

    @property
    def sweep(self) -> Path:
        return self.root / SWEEP_FILE

    @property
    def all_trials(self) -> Path:
        return self.root / ALL_TRIALS_FILE

    @property
    def sweep_record(self) -> Path:
        return self.root / SWEEP_RECORD_FILE

    @property
    def best_config(self) -> Path:
        return self.root / BEST_CONFIG_FILE

    @property
    def best_model(self) -> Path:
        return self.root / BEST_MODEL_DIR

    @property
    def best_replay(self) -> Path:
        return self.root / BEST_REPLAY_DIR

    @property
    def explore_settings(self) -> Path:
        return self.root / EXPLORE_SETTINGS_FILE

    @property
    def explored(self) -> Path:
        return self.root / EXPLORED_FILE

    @property
    def explored_record(self) -> Path:
        return self.root / EXPLORED_RECORD_FILE

    @property
    def explore_library(self) -> Path:
        return self.root / EXPLORE_LIBRARY_DIR

    @property
    def explore_lookup_scores(self) -> Path:
        return self.root / EXPLORE_LOOKUP_SCORES_FILE

    def round(self, round_index: int) -> Path:
        """``round_k/``: the save_dir of the surrogate finetuned to acquire round k's batch."""
        return self.root / f"{ROUND_PREFIX}_{round_index}"

    def round_training(self, round_index: int) -> Path:
        return self.round(round_index) / ROUND_TRAINING_FILE

    def round_predictions(self, round_index: int) -> Path:
        return self.round(round_index) / ROUND_PREDICTIONS_FILE

    def trial(self, trial_id: str) -> Path:
        """``trials/<trial id>/``: one sweep trial's config.yaml and metrics.csv."""
        return self.root / TRIALS_DIR / trial_id

    def earlier_run_outputs(self) -> list[Path]:
        """What a finetune or a tune run left in this save_dir (its fold_k/ directories and named entries, present
        ones only; earlier_runs/ stays): what a new run of other settings, or of the other kind, moves aside. Empty
        when only run_state.json is there (a run that wrote nothing else); run_state.json comes last, so an
        interrupted move is finished by the next run (it still finds the earlier run's id)."""
        named = [self.config, self.splits, self.invalid_smiles, self.run_record, self.report, self.storage]
        if self.sweep.exists() or self.all_trials.exists():  # only a sweep's: trials/ or tune/ may be the user's
            named += [self.sweep, self.all_trials, self.sweep_record, self.best_config, self.best_model,
                      self.best_replay, self.root / TRIALS_DIR, self.root / TUNE_EXPERIMENT_DIR]
        found = [fold for _, fold in self.folds()] + [path for path in named if path.exists()]
        return found + [self.run_state] if found and self.run_state.exists() else found


def member_directories(fold_dir: Path) -> list[tuple[int, Path]]:
    """The member directories present in ``fold_dir``, (m, model_m/) in numeric order."""
    return numbered(fold_dir, MEMBER_PREFIX)


def fold_directory(root: Path, first_member: Path) -> Path | None:
    """The directory holding the applicability domain of ``first_member`` (``fold_k/model_0/model``): its fold, or
    ``root`` (a folder of models with one domain); None when neither has one."""
    for candidate in (first_member.parent.parent, root):
        if (candidate / DOMAIN_FILE).is_file():
            return candidate
    return None


__all__ = [
    "ALL_TRIALS_FILE", "ATTRIBUTIONS_FILE_SUFFIX", "BESIDE_OUTPUT_SUFFIXES", "BEST_CONFIG_FILE", "BEST_MODEL_DIR",
    "BEST_REPLAY_DIR", "CALIBRATION_FILE", "CHECKPOINT_STATE_FILE", "CLASS_CALIBRATION_FILE", "COMPLETE_MEMBER_FILE",
    "CORPUS_RECORD_FILE", "DOMAIN_ARRAYS_FILE", "DOMAIN_FILE", "DOMAIN_SCORES_SUFFIX", "EARLIER_RUNS_DIR",
    "EXPLORED_FILE", "EXPLORED_RECORD_FILE", "EXPLORE_SETTINGS_FILE", "FOLD_PREFIX", "INVALID_SMILES_FILE",
    "IN_TRAINING_SPLIT_KEY",
    "MEMBER_PREFIX", "METRICS_FILE", "MODEL_DIR", "MODEL_VOCAB_FILES", "REPORT_FILE", "REPORT_SUFFIX", "ROUND_LOGS",
    "ROUND_PREDICTIONS_FILE", "ROUND_PREFIX", "ROUND_TRAINING_FILE", "RUN_CONFIG_FILE", "RUN_RECORD_FILE",
    "RUN_STATE_FILE", "RunLayout", "SPLITS_FILE", "STORAGE_DIR", "SWEEP_FILE", "SWEEP_RECORD_FILE",
    "TEST_RESULT_FILE", "TEST_SPREAD_FILE", "TRIALS_DIR", "UNCERTAINTY_SCORES_SUFFIX", "UPSTREAM_MODEL_FILE",
    "beside_output", "fold_directory", "fold_name", "member_directories", "numbered"
]
