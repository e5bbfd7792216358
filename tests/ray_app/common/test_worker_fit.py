"""More training workers than the cluster can hold (issue 21 item 4): on one machine `kermt finetune`, `tune` and
`pretrain` stop with one line before any work (`--dry_run`, which starts no cluster, says the run checks it); on a
cluster that may still grow, a line says what a run waits for and repeats while it waits."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import threading
import time

import pytest

from kermt.data.corpus_prep import prepare_corpus
from ray_app.cli import main as kermt
from ray_app.common.concurrency import repeat_waiting_line, worker_demand
from tests.conftest import DATA_DIR, FIXTURE_DIR

ROOT = DATA_DIR.parents[1]


def write_sample(path, molecules: int):
    """The header and the first ``molecules`` rows of the sample data (3 regression tasks) as ``path``."""
    lines = (ROOT / "data/sample/admet_demo.csv").read_text().splitlines()[:molecules + 1]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def smiles_csv(tmp_path_factory):
    return write_sample(tmp_path_factory.mktemp("fit") / "data.csv", 40)


@pytest.fixture
def too_many(ray_cluster) -> tuple[int, int]:
    """(workers the session cluster cannot hold, the CPUs it has)."""
    cpus = int(ray_cluster["CPU"])
    return cpus + 2, cpus


def finetune_argv(smiles_csv, save_dir, workers: int) -> list[str]:
    return ["--data_path", str(smiles_csv), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"),
            "--save_dir", str(save_dir), "--epochs", "1", "--num_workers", str(workers)]


def expected_error(command: str, workers: int, cpus: int, flag: str = "--num_workers") -> str:
    return (f"kermt {command}: error: {flag} {workers}: a run starts its {workers} worker(s) at once and needs "
            f"{workers} CPU, but this one-machine Ray cluster has {cpus} CPU and nothing will add more, so it would "
            f"wait forever. Give {flag} {cpus} or less, or attach to a larger cluster (--address)")


def test_finetune_is_refused_before_any_work(too_many, smiles_csv, tmp_path, capsys):
    workers, cpus = too_many
    started = time.monotonic()
    assert kermt(["finetune", *finetune_argv(smiles_csv, tmp_path / "run", workers)]) == 2
    assert time.monotonic() - started < 30  # not a wait: refused before featurising or training
    assert expected_error("finetune", workers, cpus) in capsys.readouterr().err.splitlines()
    assert not (tmp_path / "run").exists()


def test_finetune_dry_run_prints_the_plan_and_leaves_the_fit_to_the_run(smiles_csv, tmp_path, capsys):
    """A dry run starts no cluster (ray_app.finetune.dry_run): it says the fit is checked when the run starts."""
    assert kermt(["finetune", *finetune_argv(smiles_csv, tmp_path / "run", 64), "--dry_run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("would train 1 model(s) x 1 fold(s)") and line.endswith("each with 64 worker(s) (1 "
                                                                                        "CPU each)") for line in out)
    assert out[-1].endswith("whether a run's workers fit, are checked when the run starts")


def test_tune_trials_are_refused_before_any_work(too_many, smiles_csv, tmp_path, capsys):
    workers, cpus = too_many
    argv = ["tune", *finetune_argv(smiles_csv, tmp_path / "tune", 1), "--num_workers_per_trial", str(workers),
            "--n_trials", "2"]
    assert kermt(argv) == 2
    assert expected_error("tune", workers, cpus, "--num_workers_per_trial") in capsys.readouterr().err.splitlines()
    assert not (tmp_path / "tune").exists()


def test_pretrain_is_refused_before_any_work(too_many, tmp_path, capsys):
    workers, cpus = too_many
    with open(ROOT / "data/sample/admet_demo.csv", newline="") as f:
        smiles = [row["smiles"] for row in csv.DictReader(f)][:20]
    prepare_corpus({"demo": smiles}, str(tmp_path / "corpus"))
    argv = ["pretrain", "--data_path", str(tmp_path / "corpus"), "--save_dir", str(tmp_path / "run"),
            "--hidden_size", "16", "--depth", "2", "--num_attn_head", "2", "--epochs", "1",
            "--num_workers", str(workers)]
    assert kermt(argv) == 2
    assert expected_error("pretrain", workers, cpus) in capsys.readouterr().err.splitlines()
    assert not (tmp_path / "run").exists()


def test_the_waiting_line_repeats_while_the_cluster_is_too_small(too_many, capsys):
    workers, cpus = too_many
    stop = threading.Event()
    waiting = repeat_waiting_line(worker_demand(workers, use_gpu=False), interval_s=0.2, stop=stop)
    time.sleep(1.5)
    stop.set()
    waiting.join(timeout=10)
    assert not waiting.is_alive()
    lines = capsys.readouterr().out.splitlines()
    expected = (f"waiting for the cluster to grow: a run needs {workers} CPU for its workers, the cluster has "
                f"{cpus} CPU (the autoscaler adds nodes for pending runs)")
    assert len(lines) >= 3 and set(lines) == {expected}


def test_the_waiting_line_ends_once_the_cluster_holds_the_run(too_many, capsys):
    _, cpus = too_many
    waiting = repeat_waiting_line(worker_demand(cpus, use_gpu=False), interval_s=0.2)
    waiting.join(timeout=10)
    assert not waiting.is_alive()
    assert capsys.readouterr().out.splitlines() == [f"the cluster now holds a run's workers ({cpus} CPU)"]


WAITING_SCRIPT = """
import time
from ray_app.common import concurrency
from ray_app.common.cluster import connect

connect(num_cpus=0, object_store_mb=100)  # a head without CPUs: every worker would run on a node yet to come
concurrency.WAIT_NOTICE_S = 0.3
waiting = concurrency.check_workers_fit(2, use_gpu=False)
time.sleep(2)
print("still waiting:", waiting.is_alive())
"""


def test_a_cluster_that_may_grow_gets_a_waiting_line_that_repeats(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", WAITING_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    expected = ("waiting for the cluster to grow: a run needs 2 CPU for its workers, the cluster has 0 CPU (the "
                "autoscaler adds nodes for pending runs)")
    assert lines.count(expected) >= 4 and "still waiting: True" in lines, done.stdout
