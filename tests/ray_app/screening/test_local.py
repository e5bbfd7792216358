"""`--engine local` (in this process, no Ray) writes what `--engine ray` writes, byte for byte: predictions with
every output column, reports, eval's test_result.csv, fingerprints and embeddings; and `--engine auto` picks the
in-process path for a small local input with no cluster named or running, without importing Ray."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ray_app.screening.commands import main_embed, main_eval, main_fingerprint, main_predict
from tests.conftest import FIXTURE_DIR
from tests.ray_app.screening.test_load_run import QUERY, _calibrated_ensemble

ROOT = Path(__file__).resolve().parents[3]


def _both(main, tmp_path: Path, name: str, flags: list[str]) -> tuple[Path, Path]:
    """``main`` run with --engine local and --engine ray, each writing ``name`` in a folder of its own."""
    outputs = []
    for engine in ("local", "ray"):
        (tmp_path / engine).mkdir(exist_ok=True)
        out = tmp_path / engine / name
        assert main([*flags, "--output_path", str(out), "--engine", engine]) == 0, engine
        outputs.append(out)
    return outputs[0], outputs[1]


def _report_text(path: Path) -> str:
    """A report without what differs between any two runs: its folder, when it was built, how long reading and
    the drawn molecules' attributions took."""
    text = path.read_text().replace(str(path.parent), "OUT")
    text = re.sub(r"on \d{4}-\d\d-\d\d \d\d:\d\d UTC", "on DATE", text)
    return re.sub(r"(\): | in )[0-9.e-]+ s</p>", r"\1T s</p>", text)


def test_predict_writes_the_same_file_and_report_on_either_engine(ray_cluster, tmp_path):
    """A calibrated 2-member ensemble with its domain, every optional column, an invalid row and an id column,
    batches of 7 (so blocks and batches split the input unevenly)."""
    run = tmp_path / "run"
    _calibrated_ensemble(run)
    pd.DataFrame({"smiles": QUERY, "compound": [f"c{i}" for i in range(len(QUERY))]}).to_csv(
        tmp_path / "q.csv", index=False)
    flags = ["--data_path", str(tmp_path / "q.csv"), "--checkpoint_dir", str(run), "--interval", "0.9",
             "--uncertainty", "--applicability_domain", "--batch_size", "7"]
    local, on_ray = _both(main_predict, tmp_path, "preds.csv", flags)
    assert local.read_bytes() == on_ray.read_bytes()
    frame = pd.read_csv(local)
    assert {"t1_lower", "t1_std", "in_domain", "compound"} <= set(frame.columns)
    assert (~frame["valid"]).sum() == 1 and frame["t1"].notna().sum() == len(QUERY) - 1
    reports = [p.with_name("preds_report.html") for p in (local, on_ray)]
    assert _report_text(reports[0]) == _report_text(reports[1])


def test_upstream_batching_and_compressed_and_smiles_file_inputs_match(ray_cluster, tmp_path):
    """Upstream's batch-dependent numbers need the same blocks of consecutive rows on both engines."""
    smiles = pd.read_csv(FIXTURE_DIR / "smiles.csv").smiles.tolist()
    rows = [*smiles, "not_a_smiles", *smiles[:9]]
    with gzip.open(tmp_path / "q.csv.gz", "wt") as handle:
        pd.DataFrame({"id": range(len(rows)), "smiles": rows}).to_csv(handle, index=False)
    flags = ["--data_path", str(tmp_path / "q.csv.gz"), "--smiles_column", "smiles", "--checkpoint_path",
             str(FIXTURE_DIR / "ckpt_ft_reg.pt"), "--upstream_batching", "--batch_size", "5"]
    local, on_ray = _both(main_predict, tmp_path, "preds.parquet", flags)
    assert pd.read_parquet(local).equals(pd.read_parquet(on_ray))
    assert pd.read_parquet(local)["id"].tolist() == [str(i) for i in range(len(rows))]
    (tmp_path / "q.smi").write_text("".join(f"{s}\tmol{i}\n" for i, s in enumerate(rows)))
    flags[1] = str(tmp_path / "q.smi")
    local, on_ray = _both(main_predict, tmp_path, "smi.csv", [*flags[:2], *flags[4:]])
    assert local.read_bytes() == on_ray.read_bytes()
    assert pd.read_csv(local)["name"].tolist()[:2] == ["mol0", "mol1"]


def test_eval_fingerprint_and_embed_write_the_same_files_on_either_engine(ray_cluster, tmp_path, capsys):
    flags = ["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"),
             "--show_individual_scores"]
    local, on_ray = _both(main_eval, tmp_path, "test_result.csv", flags)
    assert local.read_bytes() == on_ray.read_bytes()
    scores = [line for line in capsys.readouterr().out.splitlines() if line.startswith("test ")]
    assert len(scores) == 6 and scores[:3] == scores[3:]  # t1, t2, overall: printed the same by both
    common = ["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_cls.pt")]
    local, on_ray = _both(main_fingerprint, tmp_path, "fps.npz", common)
    with np.load(local) as a, np.load(on_ray) as b:
        assert a["fps"].shape[0] == 26 and np.array_equal(a["fps"], b["fps"], equal_nan=True)
    local, on_ray = _both(main_embed, tmp_path, "emb.parquet", common)
    assert pd.read_parquet(local).equals(pd.read_parquet(on_ray))


AUTO_SCRIPT = """
import json, os, sys
from pathlib import Path
from ray_app.screening.config import LOCAL_MAX_ROWS, PredictConfig
from ray_app.screening.engines import resolve_engine
from ray_app.screening.commands import main_predict

tmp, checkpoint = Path(sys.argv[1]), sys.argv[2]
def engine(data, **flags):
    config = PredictConfig(data_path=str(data), output_path=str(tmp / "x.csv"), checkpoint_path=checkpoint, **flags)
    return resolve_engine(config).engine

(tmp / "big.csv").write_text("smiles\\n" + "C\\n" * (LOCAL_MAX_ROWS + 1))
choices = {"small": engine(tmp / "q.csv"), "big": engine(tmp / "big.csv"),
           "concurrency": engine(tmp / "q.csv", concurrency=2), "uri": engine("s3://bucket/q.csv"),
           "forced": engine(tmp / "big.csv", engine="local")}
os.environ["RAY_ADDRESS"] = "127.0.0.1:1"
choices["ray_address"] = engine(tmp / "q.csv")
del os.environ["RAY_ADDRESS"]
status = main_predict(["--data_path", str(tmp / "q.csv"), "--output_path", str(tmp / "auto.csv"),
                       "--checkpoint_path", checkpoint])
print(json.dumps({"choices": choices, "status": status, "ray_imported": "ray" in sys.modules}))
"""


def test_auto_runs_a_small_local_input_in_this_process_without_importing_ray(tmp_path):
    pd.DataFrame({"smiles": QUERY[:12]}).to_csv(tmp_path / "q.csv", index=False)
    env = {k: v for k, v in __import__("os").environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", AUTO_SCRIPT, str(tmp_path), str(FIXTURE_DIR / "ckpt_ft_cls.pt")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["choices"] == {"small": "local", "big": "ray", "concurrency": "ray", "uri": "ray",
                                 "forced": "local", "ray_address": "ray"}
    assert result["status"] == 0 and not result["ray_imported"]
    assert "engine: local (a small local input" in done.stderr
    frame = pd.read_csv(tmp_path / "auto.csv", keep_default_na=False)
    assert frame["smiles"].tolist() == QUERY[:12] and frame["valid"].tolist() == [True] * 10 + [False, True]


def test_local_engine_refuses_ray_flags_and_names_a_malformed_row(tmp_path, capsys):
    (tmp_path / "bad.csv").write_text("smiles,id\nCCO,1\nCCN,2,3\n")
    common = ["--output_path", str(tmp_path / "p.csv"), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_cls.pt"),
              "--engine", "local"]
    assert main_predict(["--data_path", str(tmp_path / "bad.csv"), *common, "--address", "auto"]) == 2
    assert "--address auto is for --engine ray" in capsys.readouterr().err
    assert main_predict(["--data_path", str(tmp_path / "bad.csv"), *common]) == 2
    assert f"{tmp_path / 'bad.csv'}: malformed CSV" in capsys.readouterr().err
    missing = ["--data_path", str(tmp_path / "missing.csv.gz"), *common[:4]]  # auto sizes a compressed file
    assert main_predict(missing) == 2
    assert f"data_path {tmp_path / 'missing.csv.gz'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()
