"""The smallest real finetune the end-to-end tests share: the first rows of the demo file, the tiny upstream
pretraining checkpoint, one epoch, quietly (what the run printed comes back)."""

from __future__ import annotations

import contextlib
import csv
import io
from pathlib import Path
from typing import Any

from ray_app.finetune.config import resolve
from ray_app.finetune.run import run_finetune
from tests.conftest import DATA_DIR, FIXTURE_DIR

DEMO = DATA_DIR.parents[1] / "data/sample/admet_demo.csv"
TASKS = ["logp", "tpsa_100"]  # demo_rows' tasks


def demo_rows(count: int) -> list[list[str]]:
    """The header and ``count`` molecules of the demo file, with the columns smiles, logp, tpsa_100."""
    with open(DEMO) as f:
        return [row[:3] for row in list(csv.reader(f))[:count + 1]]


def demo_head(count: int, path: Path) -> Path:
    """The header and the first ``count`` molecules of the demo file (all its columns) written to ``path``."""
    with open(DEMO) as f:
        rows = list(csv.reader(f))[:count + 1]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def tiny_finetune(save_dir: Path, data: Path, *flags: str) -> tuple[dict[str, Any], str]:
    """(the run's summary, what it printed) of a one-epoch finetune of ``data`` with extra ``flags``."""
    config, sources = resolve([
        "--data_path", str(data), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"),
        "--save_dir", str(save_dir), "--epochs", "1", "--batch_size", "16", "--ffn_hidden_size", "8", *flags])
    with contextlib.redirect_stdout(io.StringIO()) as out:
        summary = run_finetune(config, sources)
    return summary, out.getvalue()
