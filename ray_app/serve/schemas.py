"""The HTTP API's bodies (pydantic): what a client sends and gets back. OpenAPI at ``/docs`` is built from them.

Requests are JSON only (never a pickle): ``smiles`` must be a list of strings, an unknown key is an error, so a
typo (``"uncertainity"``) is a 422 naming it rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr

from kermt.names import level_not_percentage


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    smiles: list[StrictStr] = Field(description="molecules to predict, in the order the predictions come back")
    uncertainty: StrictBool = Field(False, description="add <task>_std: the standard deviation over the members")
    interval: Annotated[Optional[float], BeforeValidator(level_not_percentage)] = Field(
        None, gt=0, lt=1, description="a regression model: add <task>_lower/"
        "<task>_upper, conformal intervals at this level (e.g. 0.9); a classifier: "
        "add <task>_set, the conformal prediction set (\"0\", \"1\", \"0,1\" or "
        "\"\"); from the run's calibration, as `kermt predict --interval`")
    domain: StrictBool = Field(False, description="add domain_distance (mean distance to the 5 nearest training "
                               "molecules in the model's embedding) and in_domain, as `kermt predict "
                               "--applicability_domain`; models whose run saved fold_k/domain.json (GET /models)")
    embed: StrictBool = Field(False, description="add embedding: the molecule's readout embedding (member 0's "
                              "atom_from_atom then atom_from_bond mean readouts, as `kermt embed` writes them; "
                              "embedding_size floats, GET /models); at most --max_embed_molecules per request")
    attributions: StrictBool = Field(False, description="add per task <task>_atoms (each heavy atom's share of "
                                     "the prediction, in the atom order of the SMILES the model saw), <task>_baseline "
                                     "and, for a model with molecule descriptors, <task>_descriptors, as `kermt "
                                     "predict --attributions`, and attributions_note (why an entry has none); at "
                                     "most --max_attribution_molecules per request")
    depict: StrictBool = Field(False, description="add svg: the molecule drawn by RDKit (sanitised SVG; null for "
                               "an invalid SMILES); with attributions also attribution_svg: per task, the molecule "
                               "the model saw with its atoms coloured by their shares")


class Prediction(BaseModel):
    """One input molecule: its SMILES as sent, whether RDKit read it (``error``: why not), then one key per task
    (null for an invalid molecule)."""

    model_config = ConfigDict(extra="allow")

    smiles: str
    valid: bool
    error: Optional[str] = None


class PredictResponse(BaseModel):
    model: str
    predictions: list[Prediction]


@dataclass(frozen=True)
class PredictJob:
    """One request's molecules as the ingress hands them to a model replica (plain strings, already validated)."""

    smiles: tuple[str, ...]
    uncertainty: bool = False
    interval: Optional[float] = None
    domain: bool = False
    embed: bool = False
    attributions: bool = False


class MemberInfo(BaseModel):
    path: str
    sha256: str


class TrainingMetrics(BaseModel):
    """What the finetune run's run.json recorded (ray_app/serve/run_metrics.py); null where it recorded nothing."""

    run_id: Optional[str] = None
    metric: Optional[str] = Field(None, description="the test metric (rmse, auc, ...)")
    split_type: Optional[str] = None
    split: Optional[str] = Field(None, description="the split in words: split_type, or which parts came from "
                                 "separate files (given files: val ..., test ...)")
    overall_test_score: Optional[float] = Field(None, description="the ensemble's test score, mean over folds")
    overall_test_std: Optional[float] = Field(None, description="its spread over folds")
    fold_test_scores: Optional[list[Optional[float]]] = None
    task_test_scores: Optional[dict[str, Optional[float]]] = Field(None, description="per task: the members' "
                                                                   "test scores, mean over members and folds")
    calibration_method: Optional[str] = None
    calibration_size: Optional[dict[str, int]] = Field(None, description="per task: molecules the calibration "
                                                       "was fitted on, over the folds")
    calibration_source: Optional[str] = Field(None, description="what they were: \"validation molecules\", or the "
                                              "--calibration_path file as run.json names it")


class ModelInfo(BaseModel):
    name: str
    default: bool
    tasks: list[str]
    dataset_type: str
    features_generator: list[str]
    features_scaling: bool
    padding: str
    standardize: str = Field("none", description="how the model's molecules are standardised (parent: largest "
                             "organic fragment, neutralised; none); an entry's model_smiles says what it saw")
    members: list[MemberInfo]
    calibrated: bool = Field(False, description="the run holds a calibration: requests may ask for an interval")
    calibration_method: Optional[str] = None
    calibration_size: Optional[int] = Field(None, description="molecules per task it was fitted on")
    domain: bool = Field(False, description="the run holds an applicability domain: requests may ask for it")
    domain_missing: Optional[str] = Field(None, description="why the model has no domain, and how to get one")
    embedding_size: int = Field(0, description="floats in each molecule's embedding (\"embed\": true)")
    training: Optional[TrainingMetrics] = Field(None, description="the run's recorded test scores (null: no run.json)")


class ModelsResponse(BaseModel):
    models: list[ModelInfo]


__all__ = ["MemberInfo", "PredictJob", "ModelInfo", "ModelsResponse", "PredictRequest", "PredictResponse", "Prediction",
           "TrainingMetrics"]
