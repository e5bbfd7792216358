"""How many training runs may share the cluster: computed from free resources, never below one."""

from __future__ import annotations

from ray_app.common.concurrency import WORKER_MEMORY_BYTES, capacity, concurrent_runs

PLENTY = 64 * WORKER_MEMORY_BYTES


def test_cpu_bound_capacity_counts_whole_trainers():
    assert capacity({"CPU": 4.0, "memory": PLENTY}, num_workers=2, use_gpu=False) == 2
    assert capacity({"CPU": 5.0, "memory": PLENTY}, num_workers=2, use_gpu=False) == 2
    assert capacity({"CPU": 16.0, "memory": PLENTY}, num_workers=1, use_gpu=False) == 16


def test_gpus_and_memory_also_limit():
    assert capacity({"CPU": 32.0, "GPU": 4.0, "memory": PLENTY}, num_workers=2, use_gpu=True) == 2
    assert capacity({"CPU": 32.0, "GPU": 4.0, "memory": PLENTY}, num_workers=2, use_gpu=False) == 16
    assert capacity({"CPU": 32.0, "memory": 3 * WORKER_MEMORY_BYTES}, num_workers=1, use_gpu=False) == 3


def test_one_run_always_starts_even_on_a_busy_cluster():
    assert capacity({"CPU": 0.5}, num_workers=2, use_gpu=False) == 1
    assert capacity({"CPU": 8.0}, num_workers=1, use_gpu=True) == 1  # no GPU free: one run waits for one


def test_user_cap_and_run_count_bound_the_result():
    assert concurrent_runs(3, num_workers=1, use_gpu=False, runs=10) == 3
    assert concurrent_runs(8, num_workers=1, use_gpu=False, runs=4) == 4
