"""Entry point for `ray job submit`: the same finetune as `kermt finetune`, with the same flags.

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env jobs/runtime_env.yaml -- \
        python -m jobs.finetune --config jobs/configs/demo_distributed.yaml --num_workers 4 --use_gpu

Inside a job, Ray sets RAY_ADDRESS, so the run attaches to the cluster instead of starting a local one.
"""

from __future__ import annotations

import sys

from ray_app.cli import main

if __name__ == "__main__":
    sys.exit(main(["finetune", *sys.argv[1:]]))
