"""Settings of `kermt explore`: its own (the library, the objective, the batches, the acquisition) plus every
`kermt finetune` setting that configures the surrogate, with the same names, defaults and checks.

Explore decides the finetune settings that name the surrogate's data and outputs (:data:`EXPLORE_DECIDES`): each
round trains on ``DIR/round_k/scored.csv`` (everything scored before round k), with a validation share for early
stopping and calibration and no test split, into ``DIR/round_k``, seeded from ``--seed``
(:meth:`ExploreConfig.surrogate`).
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field, ValidationError, create_model, model_validator

from kermt.errors import UserError
from kermt.explore.acquisition import DEFAULT_BETA, check_uncertainty
from kermt.explore.objective_spec import FORMS, ObjectiveSpec, parse_objective
from kermt.explore.sizes import BatchSize, parse_size
from kermt.registry import Acquisition
from ray_app.common.data_parallel import DataParallelSettings
from ray_app.finetune.config import FinetuneConfig

# Finetune settings an exploration sets itself for every round's surrogate (the data, its split, its outputs).
EXPLORE_DECIDES = (
    "data_path", "target_columns", "separate_val_path", "separate_test_path", "features_path",
    "separate_val_features_path", "separate_test_features_path", "max_data_size", "dataset_type", "split_sizes",
    "num_folds", "folds_file", "val_fold_index", "test_fold_index", "crossval_index_dir", "crossval_index_file",
    "calibration_path", "calibration_features_path", "save_dir", "seed", "overwrite", "dry_run", "smiles_column",
)
# the columns of round_k/scored.csv, the file each round's surrogate trains on
TRAINING_SMILES, TRAINING_SCORE = "smiles", "score"

SurrogateSettings = create_model(  # FinetuneConfig's fields less EXPLORE_DECIDES (checked by building one: surrogate)
    "SurrogateSettings", __base__=DataParallelSettings,
    **{name: (field.annotation, field) for name, field in FinetuneConfig.model_fields.items()
       if name not in EXPLORE_DECIDES and name not in DataParallelSettings.model_fields})


class ExploreConfig(SurrogateSettings):  # type: ignore[misc, valid-type]  # a class built by create_model
    """Every setting of an exploration. Field names are the flag names."""

    library: str = Field(description="the molecules to explore: CSV (also .csv.gz/.bz2/.zst) or Parquet with a "
                         "SMILES column (--library_smiles_column, else one named smiles, else the first)")
    library_smiles_column: Optional[str] = Field(None, description="the SMILES column of --library")
    objective: str = Field(description=f"what scores a molecule: {FORMS} (docs/explore.md)")
    minimize: bool = Field(False, description="lower scores are better (docking scores); default: higher")
    init_size: str = Field(description="the random first batch: a share of the library with a decimal point "
                           "(0.01 = 1 %) or a count (100)")
    acquire_size: str = Field(description="each later batch: a share (0.01) or a count (100)")
    iterations: int = Field(ge=1, description="rounds after the first batch: train the surrogate on everything "
                            "scored, predict the rest of the library, acquire a batch, score it")
    acquisition: Acquisition = Field("greedy", description="how a batch is chosen from the surrogate's predictions: "
                                     "greedy (best mean), ucb (mean + beta std), ei, pi (expected, probable "
                                     "improvement over the best score), thompson (a draw per molecule), random; "
                                     "all but greedy and random need the surrogate's uncertainty")
    beta: float = Field(DEFAULT_BETA, ge=0, description="ucb: the weight of the standard deviation")
    seed: int = Field(0, description="seed of the random batches, thompson's draws and every surrogate")
    objective_timeout: float = Field(600.0, gt=0, description="command: seconds a molecule may take; a task that "
                                     "runs longer is stopped and its molecules recorded as timed out")
    objective_cpus: float = Field(1.0, gt=0, description="command: CPUs each scoring task asks Ray for")
    objective_batch_size: int = Field(1, ge=1, description="command: molecules per scoring task (one run of the "
                                      "program)")
    validation_share: float = Field(0.1, gt=0, lt=1, description="share of the scored molecules each surrogate "
                                    "holds out for early stopping and calibration (no test split)")
    warm_start: bool = Field(False, description="each round's surrogate after the first starts from the previous "
                             "round's model (its encoder and head; an ensemble's member k from its member k) "
                             "instead of --checkpoint_path, and trains on everything scored as before")
    save_dir: str = Field("runs/explore", description="output directory: explored.csv, round_k/ (each round's "
                          "surrogate), report.html; the same command on it resumes the exploration")

    @model_validator(mode="after")
    def _check_explore(self) -> "ExploreConfig":
        self.objective_spec()
        self.batch_sizes()
        self.surrogate(0, "scored.csv", "round_0")
        check_uncertainty(self.acquisition, self.uncertainty_missing() is None, self.uncertainty_missing() or "")
        return self

    def objective_spec(self) -> ObjectiveSpec:
        return parse_objective(self.objective)

    def batch_sizes(self) -> tuple[BatchSize, BatchSize]:
        return parse_size(self.init_size, "--init_size"), parse_size(self.acquire_size, "--acquire_size")

    def uncertainty_missing(self) -> str | None:
        """Why the surrogate gives no uncertainty (None when it gives one: an ensemble's spread, or mve's
        variance)."""
        if self.ensemble_size > 1 or self.loss == "mve":
            return None
        return ("one model (--ensemble_size 1, --loss mse) has no spread; give --ensemble_size 3 (or more), or --loss "
                "mve")

    def surrogate(self, round_index: int, data_path: str, save_dir: str,
                  previous_model: str | None = None) -> FinetuneConfig:
        """Round ``round_index``'s surrogate: a `kermt finetune` of ``data_path`` into ``save_dir``, starting from
        ``previous_model`` (--warm_start: the previous round's) when given, else from --checkpoint_path."""
        values = {name: getattr(self, name) for name in SurrogateSettings.model_fields}
        values.update(data_path=data_path, save_dir=save_dir, seed=self.seed, dataset_type="regression",
                      smiles_column=TRAINING_SMILES, target_columns=[TRAINING_SCORE],
                      split_sizes=(1.0 - self.validation_share, self.validation_share, 0.0))
        if previous_model is not None:
            values.update(checkpoint_path=previous_model, pretrained_release=False)
        try:
            return FinetuneConfig(**values).with_split_flag("--validation_share")
        except ValidationError as error:
            raise UserError(f"the surrogate's settings: {error.errors()[0]['msg'].removeprefix('Value error, ')}"
                            ) from None


__all__ = ["EXPLORE_DECIDES", "ExploreConfig", "TRAINING_SCORE", "TRAINING_SMILES"]
