"""docs/walkthrough.md, run as a reader runs it: every ```bash block of the page, in order, read from the page
itself (so the page and this test cannot drift), in a scratch directory that sees the repository's data/, tests/
and .venv/. The one block that starts `kermt serve` runs in the background, as in the reader's first terminal, until
its /healthz answers; the blocks after it are the second terminal; it is stopped with SIGTERM (Ctrl-C) at the end.
The one change made to the commands: port 8000 becomes a free port (the machine is shared). Slow (a finetune, a
Ray cluster for it and one for serve): ``-m slow``."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import free_port
from tests.ray_app.serve.test_serve_command import stop, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "walkthrough.md"
SERVE = ".venv/bin/kermt serve"
PORT = "8000"


def bash_blocks(page: Path = PAGE) -> list[str]:
    """The page's ```bash blocks, in order."""
    return re.findall(r"^```bash\n(.*?)^```$", page.read_text(), re.MULTILINE | re.DOTALL)


def test_the_page_has_the_commands_the_test_expects():
    blocks = bash_blocks()
    assert [b.split()[0] for b in blocks] == [".venv/bin/kermt", "cat", ".venv/bin/python", ".venv/bin/kermt",
                                              "curl"]
    assert sum(b.startswith(SERVE) for b in blocks) == 1
    assert all(f":{PORT}/" in b for b in blocks if b.startswith("curl"))


def run_block(block: str, cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=1800)
    output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"{block}\nexited {result.returncode}:\n{output}"
    return result.stdout


@pytest.mark.slow
def test_every_command_of_the_walkthrough_runs(tmp_path):
    for name in ("data", "tests", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    port = str(free_port())
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)  # as a reader runs them: each command starts its own local cluster
    printed, server = [], None
    try:
        for block in bash_blocks():
            block = block.replace(f":{PORT}", f":{port}")
            if block.startswith(SERVE):
                server = subprocess.Popen(["bash", "-c", f"exec {block.strip()} --port {port}"], cwd=tmp_path,
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                wait_healthy(f"http://127.0.0.1:{port}", server, timeout_s=600)
                continue
            printed.append(run_block(block, tmp_path, env))
    finally:
        if server is not None:
            stop(server)
    finetuned, _, why, answer = printed
    run = tmp_path / "runs" / "walkthrough"
    report = html.unescape((run / "report.html").read_text())
    assert "worst-predicted test molecules" in report
    assert "Atom colours: each atom's share of the predicted logp" in report
    assert re.search(r"^report: .*runs/walkthrough/report\.html$", finetuned, re.MULTILINE), finetuned[-2000:]
    predictions = pd.read_csv(tmp_path / "new_preds.csv")
    assert len(predictions) == 6 and predictions.valid.all()
    for column in ("logp_lower", "logp_upper", "in_domain", "domain_distance", "logp_atoms", "logp_baseline"):
        assert predictions[column].notna().all(), column
    assert "Atom colours" in (tmp_path / "new_preds_report.html").read_text()
    assert len(why.strip().splitlines()) == 6 and "raised most by" in why
    entries = json.loads(answer)["predictions"]
    assert [e["smiles"] for e in entries] == ["CC(=O)Nc1ccc(O)cc1", "c1ccc2ccccc2c1"]
    for entry, (_, row) in zip(entries[:1], predictions.iloc[[1]].iterrows()):  # paracetamol, in both
        assert entry["logp"] == pytest.approx(row["logp"], abs=1e-5)
        assert entry["logp_lower"] == pytest.approx(row["logp_lower"], abs=1e-5)
        assert entry["in_domain"] == row["in_domain"]
        assert entry["logp_atoms"] == pytest.approx(json.loads(row["logp_atoms"]), rel=1e-3, abs=1e-6)
