"""The one "is this better?" rule of best epochs (member loop) and best trials (`kermt tune`)."""

from __future__ import annotations

import math

from kermt.train.objective import Objective

NAN = math.nan


def test_the_objective_follows_the_metric_or_the_loss():
    assert Objective.of("rmse", select_by_loss=False) == Objective("val_rmse", "min")
    assert Objective.of("auc", select_by_loss=False) == Objective("val_auc", "max")
    assert Objective.of("auc", select_by_loss=True) == Objective("val_loss", "min")


def test_nan_never_wins_anything_scored_beats_nan_and_a_tie_keeps_the_first():
    lower, higher = Objective("val_rmse", "min"), Objective("val_auc", "max")
    assert lower.better(1.0, 2.0) and not lower.better(2.0, 1.0)
    assert higher.better(0.9, 0.8) and not higher.better(0.8, 0.9)
    assert not lower.better(1.0, 1.0) and not higher.better(0.9, 0.9)
    assert not lower.better(NAN, 2.0) and not lower.better(NAN, NAN)
    assert lower.better(5.0, NAN) and higher.better(0.1, NAN)
