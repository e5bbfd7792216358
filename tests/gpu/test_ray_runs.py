"""The Ray paths on one GPU: `kermt finetune --use_gpu` (one Ray Train worker on the GPU, test predictions by a
GPU task) and `kermt predict --use_gpu` (the model actor on the GPU), each against the same run on the CPU.

Tolerances. The CPU and GPU runs draw the same batches and dynamic depths, and with dropout the same masks (the
finetune loop draws them per molecule, a counter hash computed exactly on either device), so they differ only by
float summation order (~1e-7 relative per op). Over a short finetune Adam turns that into parameter differences
of up to ~1e-5 (a near-zero gradient's sign can flip), so the test metric must agree to 1e-3 relative; a
prediction from the same weights agrees to 1e-5 absolute. bf16 against fp32 end to end: within 5 %, the bound
the CPU finetune test uses (tests/ray_app/finetune/test_finetune.py).

Not covered here: several GPUs in one run (NCCL all-reduce) needs a multi-GPU machine; one GPU can only host one
worker (Ray Train gives each worker a whole device).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.conftest import FIXTURE_DIR
from tests.gpu.cuda import GPU_LANE

pytestmark = GPU_LANE
pytest.importorskip("ray", reason="the Ray part of the GPU lane needs ray installed")
pytest.importorskip("pydantic", reason="the Ray part of the GPU lane needs pydantic installed (ray_app's configs)")

# E402 below: imported only once the importorskips above have passed
from ray_app.finetune.config import resolve  # noqa: E402
from ray_app.finetune.run import run_finetune  # noqa: E402
from ray_app.screening.commands import main_predict  # noqa: E402
from tests.kermt.test_inference import OUTPUTS, PARITY  # noqa: E402
from tests.ray_app.conftest import ray_cluster  # noqa: E402, F401 - the session's local Ray cluster
from tests.ray_app.finetune.test_finetune import demo_csv  # noqa: E402, F401 - fixture: 80 rows

METRIC_RTOL, METRIC_ATOL = 1e-3, 1e-4
BF16_RTOL = 0.05
PREDICT_ATOL = 1e-5


def _finetune(demo_csv, save_dir, *extra: str) -> float:  # noqa: F811 - the fixture
    config, sources = resolve([
        "--data_path", str(demo_csv), "--checkpoint_path", str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"),
        "--save_dir", str(save_dir), "--epochs", "3", "--batch_size", "16", "--ffn_hidden_size", "8",
        "--num_workers", "1", *extra])
    return run_finetune(config, sources)["overall_random_test_rmse"]


@pytest.mark.parametrize("dropout", ["0.0", "0.1"])
def test_one_gpu_finetune_matches_the_cpu_run(ray_cluster, demo_csv, tmp_path, dropout):  # noqa: F811 - fixtures
    assert ray_cluster.get("GPU", 0) >= 1, f"the local Ray cluster sees no GPU: {ray_cluster}"
    drops = ["--dropout", dropout, "--bond_drop_rate", dropout]
    cpu = _finetune(demo_csv, tmp_path / "cpu", *drops)
    gpu = _finetune(demo_csv, tmp_path / "gpu", *drops, "--use_gpu")
    print(f"1-GPU finetune, dropout {dropout}: test rmse {gpu:.6f}, CPU {cpu:.6f} "
          f"(relative {abs(gpu - cpu) / cpu:.1e})")
    assert gpu == pytest.approx(cpu, rel=METRIC_RTOL, abs=METRIC_ATOL)


def test_one_gpu_bf16_finetune_stays_close_to_fp32(ray_cluster, demo_csv, tmp_path):  # noqa: F811 - fixtures
    fp32 = _finetune(demo_csv, tmp_path / "fp32", "--use_gpu")
    bf16 = _finetune(demo_csv, tmp_path / "bf16", "--use_gpu", "--precision", "bf16")
    print(f"1-GPU finetune test rmse: bf16 {bf16:.6f}, fp32 {fp32:.6f} (relative {abs(bf16 - fp32) / fp32:.1e})")
    assert bf16 != fp32  # autocast really ran
    assert bf16 == pytest.approx(fp32, rel=BF16_RTOL)


def test_predict_with_the_actor_on_the_gpu_equals_the_cpu(ray_cluster, tmp_path):  # noqa: F811 - the fixture
    frames = {}
    for where, extra in (("cpu", []), ("gpu", ["--use_gpu"])):
        out = tmp_path / f"{where}.csv"
        assert main_predict(["--data_path", str(FIXTURE_DIR / "smiles.csv"), "--output_path", str(out),
                             "--checkpoint_path", str(FIXTURE_DIR / "ckpt_ft_reg.pt"), *extra]) == 0
        frames[where] = pd.read_csv(out, keep_default_na=False)[["t1", "t2"]].to_numpy(float)
    distance = float(np.abs(frames["gpu"] - frames["cpu"]).max())
    print(f"predict on the GPU actor: max |gpu - cpu| = {distance:.2e}")
    assert distance <= PREDICT_ATOL
    np.testing.assert_allclose(frames["gpu"], OUTPUTS["ft_reg_final_prediction"], rtol=0, atol=PARITY)
