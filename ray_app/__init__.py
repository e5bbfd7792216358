"""Ray Train / Data / Tune application built on the ``kermt`` library."""

import os

from ray_app.common.ray_internals import DEDUP_ALLOW_REGEX_VARIABLE

# Every training run prints one progress line per epoch from its rank-0 worker ("[fold 0 model 1] epoch    3 ...",
# "[trial 8f3a_00002] epoch ..."; ray_app/finetune/train_loop.py, ray_app/common/worker_loop.py). Ray's driver folds
# lines that differ only in words holding digits once they come from more than one process within 5 s ("[repeated
# 8x across cluster]"), so with two members or trials training at once most epochs never reached the console, and
# no wording without digits can tell the epochs apart. These lines, and only these, are exempt: Ray's own repeated
# warnings stay folded. Ray reads the variable when it is imported, hence here, before any ray_app module imports
# ray; a user's own setting wins.
PROGRESS_LINE = r"^\[[^\]]+\] (epoch|starting epoch|resuming at epoch) "
os.environ.setdefault(DEDUP_ALLOW_REGEX_VARIABLE, PROGRESS_LINE)
