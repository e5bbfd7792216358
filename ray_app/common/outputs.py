"""Files a finetune run leaves in ``--save_dir`` (rank 0 / the driver writes them; every write is atomic)."""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from kermt import DISTRIBUTION
from kermt.run_layout import RUN_CONFIG_FILE


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text)
    os.replace(staging, path)


@contextmanager
def replacing_directory(target: Path) -> Iterator[Path]:
    """A hidden sibling of ``target`` (not yet created) for the block to fill; when the block ends, it replaces
    ``target``, renamed into place, so no reader sees half a folder. If the block raises, ``target`` is untouched."""
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    yield staging
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def _cell(value: float) -> str:
    return "" if value is None or np.isnan(value) else repr(float(value))


def test_result_csv(smiles: Sequence[str], task_names: Sequence[str], preds: np.ndarray,
                    targets: np.ndarray | None) -> str:
    """Upstream's layout: index = SMILES (blank header cell); two header rows ``preds..., targets...`` and the task
    names; a blinded test set (no targets) has one header row of task names."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if targets is None:
        writer.writerow([""] + list(task_names))
    else:
        writer.writerow([""] + ["preds"] * len(task_names) + ["targets"] * len(task_names))
        writer.writerow([""] + list(task_names) * 2)
    for i, smi in enumerate(smiles):
        row = [smi] + [_cell(v) for v in preds[i]]
        if targets is not None:
            row += [_cell(v) for v in targets[i]]
        writer.writerow(row)
    return out.getvalue()


def metrics_csv(history: Sequence[dict[str, Any]]) -> str:
    """One row per epoch, columns in first-seen order."""
    columns: list[str] = []
    for row in history:
        columns += [k for k in row if k not in columns]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    return out.getvalue()


# metrics.csv column -> TensorBoard tag of a finetune epoch: upstream's three scalars, then what upstream does not
# write (the learning rate at the epoch's end, the epoch's train and validation seconds)
_EPOCH_TAGS = {"train_loss": "loss/train", "val_loss": "loss/val", "lr": "learning_rate",
               "train_time_s": "time/train_s", "val_time_s": "time/val_s"}


def write_tensorboard(directory: Path, history: Sequence[dict[str, Any]], metric: str) -> None:
    """One event file per member, a scalar per epoch: loss/train, loss/val and {metric}_val (upstream's tags),
    learning_rate, time/train_s, time/val_s. Open with ``tensorboard --logdir SAVE_DIR``."""
    from torch.utils.tensorboard import SummaryWriter

    tags = {**_EPOCH_TAGS, f"val_{metric}": f"{metric}_val"}
    with SummaryWriter(log_dir=str(directory)) as writer:
        for row in history:
            for column, tag in tags.items():
                if row.get(column) is not None:
                    writer.add_scalar(tag, float(row[column]), int(row["epoch"]))


def _git_sha() -> str | None:
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _versions() -> dict[str, str | None]:
    names = (DISTRIBUTION, "torch", "ray", "rdkit", "descriptastorus", "numpy", "pandas", "scikit-learn")
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def run_record(settings: dict[str, Any], sources: dict[str, str], resources: dict[str, Any],
               extra: dict[str, Any]) -> str:
    """run.json: versions, git sha, cluster resources, every setting with its source, and a replay command."""
    record = {
        "versions": _versions(),
        "git_sha": _git_sha(),
        "argv": sys.argv,
        "replay": "kermt finetune --config " + shlex.quote(str(extra.get("config_yaml", RUN_CONFIG_FILE))),
        "cluster_resources": resources,
        "settings": {k: {"value": v, "source": sources.get(k, "default")} for k, v in settings.items()},
        **extra,
    }
    return json.dumps(record, indent=2, default=str) + "\n"
