"""`kermt explore --warm_start` with an ensemble: member k of round 2's surrogate starts from member k of round 1's
(so the members stay apart and the ensemble keeps its spread), as each saved member's provenance and its training
workers' lines in finetune.log say; and each round's predict.log names the engine once (round 1 featurises the
library on the engine it then predicts on).

Slow (two 2-member finetunes on a local Ray cluster, minutes on 2 cores): `-m slow`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from kermt.explore.explored import read_explored
from ray_app.cli import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "data" / "sample" / "admet_demo.csv"
SURROGATE = ["--checkpoint_path", str(ROOT / "tests" / "data" / "kermt_upstream" / "ckpt_pretrain_vocab.pt"),
             "--ensemble_size", "2", "--epochs", "3", "--batch_size", "32", "--max_lr", "0.002", "--final_lr",
             "0.0002", "--warmup_epochs", "1", "--ffn_hidden_size", "16"]


@pytest.fixture(scope="module")
def warm_run(ray_cluster, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("warm_start")
    library = folder / "library.csv"
    pd.read_csv(DEMO).head(160).to_csv(library, index=False)
    save_dir = folder / "run"
    assert main(["explore", "--library", str(library), "--objective", f"lookup:{library}:logp", "--init_size", "80",
                 "--acquire_size", "20", "--iterations", "2", "--acquisition", "ucb", "--seed", "5", "--warm_start",
                 "--save_dir", str(save_dir), *SURROGATE]) == 0
    return save_dir


def _started_from(member: Path) -> str:
    return json.loads((member / "model" / "config.json").read_text())["provenance"]["checkpoint_path"]


def test_each_member_starts_from_its_own_previous_self(warm_run):
    assert read_explored(str(warm_run / "explored.csv")).rounds_done == 3
    previous = [warm_run / "round_1" / "fold_0" / f"model_{k}" / "model" for k in range(2)]
    first_round = {_started_from(warm_run / "round_1" / "fold_0" / f"model_{k}") for k in range(2)}
    assert first_round == {str(ROOT / "tests" / "data" / "kermt_upstream" / "ckpt_pretrain_vocab.pt")}
    started = [_started_from(warm_run / "round_2" / "fold_0" / f"model_{k}") for k in range(2)]
    assert started == [str(p) for p in previous] and started[0] != started[1]
    # what the training workers loaded, as they said it (Ray forwards worker lines to the log, and may drop one)
    said = re.findall(r"fold 0 model (\d): starts from (\S+)", (warm_run / "round_2" / "finetune.log").read_text())
    assert said and all(path == str(previous[int(k)]) for k, path in said), said


def test_each_round_names_its_engine_once(warm_run):
    for k in (1, 2):
        lines = (warm_run / f"round_{k}" / "predict.log").read_text().splitlines()
        assert sum(line.startswith("engine: ") for line in lines) == 1, lines
