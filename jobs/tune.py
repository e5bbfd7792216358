"""Entry point for `ray job submit`: the same sweep as `kermt tune`, with the same flags.

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env jobs/runtime_env.yaml -- \
        python -m jobs.tune --config jobs/configs/demo_distributed.yaml --n_trials 20 \
        --search_space jobs/configs/tune_space.yaml --max_concurrent_trials 4 --save_dir /shared/runs/tune

Inside a job, Ray sets RAY_ADDRESS, so the sweep attaches to the cluster instead of starting a local one. Submit
the same command again to resume an interrupted sweep (same --save_dir, on storage every node can reach).
"""

from __future__ import annotations

import sys

from ray_app.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
