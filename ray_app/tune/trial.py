"""One `kermt tune` trial: a finetune of fold 0 / model 0 with the trial's settings, trained by finetune's trainable.

Ray 2.60 cannot tune a TorchTrainer directly (Train V2), so a trial is the function trainable that trains the
(fold, member)s of `kermt finetune` (``ray_app.finetune.trainable.train_member``); :class:`TuneTrial` tells it which
settings to train with and forwards every epoch's metrics to Tune through the Train run's callbacks. Upstream's HPO
has no folds either: every trial trains on the split of fold 0 (seed ``--seed``), put in the object store once by
the driver, so trials differ only by their hyperparameters.

Trial files (``save_dir/trials/<trial_id>/``): config.yaml (the trial's finetune settings), model/ (native),
model.pt (upstream layout), metrics.csv, and result.json. The trial reports them as its Tune checkpoint and the
driver downloads them as trials finish. A resumed trial whose checkpoint holds result.json reports it instead of
training again.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from pydantic import ValidationError
from ray.tune.integration.ray_train import TuneReportCallback

from kermt.checkpoint.native import saved_spec
from kermt.inference.widths import WidthRule, width_rule
from kermt.run_layout import RunLayout
from kermt.train.objective import Objective
from kermt.train.step import score
from ray_app.common import outputs
from ray_app.common.settings import to_yaml
from ray_app.finetune.config import FinetuneConfig
from ray_app.finetune.members import member_test_predictions
from ray_app.finetune.prepare import ScaledSplits
from ray_app.finetune.run_setup import RunSetup
from ray_app.finetune.trainable import Member, MemberTrial
from ray_app.tune.search_space import trial_settings

OBJECTIVE = "objective"  # best validation value so far (per epoch) / of the trial (final result)
COMPLETED = "completed"  # only in a trial's final result: it trained every epoch and saved its model


class ObjectiveReport(TuneReportCallback):
    """Tune's Train callback, adding ``objective`` (the best validation value so far) to every epoch's report,
    so the searcher sees one metric in every result, including those of trials the scheduler stops early."""

    def __init__(self, objective: Objective):
        super().__init__()
        self.objective = objective
        self.best = float("nan")

    def after_report(self, run_context, metrics, checkpoint):
        value = float(metrics[0].get(self.objective.key, float("nan")))
        if self.objective.better(value, self.best):
            self.best = value
        super().after_report(run_context, [{**metrics[0], OBJECTIVE: self.best}, *metrics[1:]], checkpoint)


def trial_config(base: FinetuneConfig, params: Mapping[str, Any]) -> FinetuneConfig:
    """The base settings with the trial's parameters; an impossible combination is a clear error."""
    settings = trial_settings(params, base)
    try:
        return FinetuneConfig(**{**base.model_dump(), **settings})
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in error.errors())
        raise ValueError(f"trial parameters {settings} are not a valid finetune configuration: {problems}") from None


class TuneTrial(MemberTrial):
    """`kermt tune`'s trials of finetune's trainable: model 0 of fold 0 with the trial's sampled settings, every
    epoch's validation value reported to Tune (with the objective so far), and the files a trial leaves:
    config.yaml (the trial's finetune settings) and result.json with its objective and test score."""

    def __init__(self, objective: Objective):
        super().__init__()
        self.objective = objective

    def member(self, setup: RunSetup, params: dict[str, Any], trial_id: str) -> Member:
        config = trial_config(setup.config, params)
        # A stable Train run name per trial: a trial restarted after an interruption resumes its Train run.
        trial_setup = replace(setup, config=config, sources={**setup.sources, **{k: "user" for k in params}},
                              run_id=f"trial-{trial_id}")
        return Member(trial_setup, 0, 0, f"trial {trial_id}")

    def callbacks(self, member: Member) -> list:
        return [ObjectiveReport(self.objective)]

    def finish(self, member: Member, model, splits: ScaledSplits, history: list, directory: Path) -> dict[str, Any]:
        outputs.atomic_write_text(RunLayout(directory).config, to_yaml(member.setup.config))
        # the width rule kermt predict applies to the saved model (its recorded reference width)
        rule = width_rule([saved_spec(RunLayout(directory).model)])
        return final_result(member.setup, self.objective, history, test_score(member.setup, model, splits, rule))


def final_result(setup: RunSetup, objective: Objective, history: list[dict], test_value: float) -> dict[str, Any]:
    """The trial's last Tune result: its objective (best epoch by the objective), that epoch's validation values
    and the test score of the model saved from it. No ``epoch`` key, so the scheduler ignores it."""
    best_value, chosen = math.nan, {}
    for row in history:
        if objective.better(float(row[objective.key]), best_value):
            best_value, chosen = float(row[objective.key]), row
    val_key = f"val_{setup.metric}"
    return {OBJECTIVE: float(chosen.get(objective.key, math.nan)), COMPLETED: True,
            "best_epoch": int(chosen.get("epoch", -1)), "epochs_run": len(history),
            val_key: float(chosen.get(val_key, math.nan)), "val_loss": float(chosen.get("val_loss", math.nan)),
            f"test_{setup.metric}": test_value}


def test_score(setup: RunSetup, model, splits: ScaledSplits, rule: WidthRule | None = None) -> float:
    """The saved model's task-averaged test score, computed as `kermt finetune` scores a one-model fold (NaN without
    test labels); ``rule``: the saved model's width rule (default: its padding's, with the default width)."""
    if len(splits.test) == 0 or bool(np.isnan(splits.test_targets_raw).all()):
        return float("nan")
    preds = member_test_predictions(model, splits, setup.config.step_batch_size, setup.config.use_gpu,
                                    setup.config.precision, rule)
    value, _ = score(preds, splits.test_targets_raw, setup.metric, setup.dataset_type, None)
    return float(value)


def trial_directory(save_dir: Path, trial_id: str) -> Path:
    return RunLayout(save_dir).trial(trial_id)
