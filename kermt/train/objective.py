"""What a finetune optimises, and the one rule for "is this better?": used by the member loop (kermt.train.loop) to
keep its best epoch (and count epochs without improvement for early stopping), and by `kermt tune` for a trial's
objective so far, its final result and the sweep's best trial.

The rule: a NaN value (no labels to score, a diverged model) is never better; anything scored beats a NaN best; a
tie keeps the earlier one (the first best epoch, the first best trial).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kermt.metrics import metric_direction


@dataclass(frozen=True)
class Objective:
    """``key``: the per-epoch validation column (``val_loss`` or ``val_<metric>``); ``mode``: "min" or "max"."""

    key: str
    mode: str

    @staticmethod
    def of(metric: str, select_by_loss: bool) -> "Objective":
        """``--select_by_loss``: the validation loss; otherwise the run's metric in its own direction."""
        if select_by_loss:
            return Objective("val_loss", "min")
        return Objective(f"val_{metric}", metric_direction(metric))

    def better(self, value: float, best: float) -> bool:
        if math.isnan(value):
            return False
        return math.isnan(best) or (value < best if self.mode == "min" else value > best)


__all__ = ["Objective"]
