"""Entry point for `ray job submit`: the same exploration as `kermt explore`, with the same flags.

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env jobs/runtime_env.yaml -- \
        python -m jobs.explore --library lib.csv --objective command:./dock.sh --minimize --init_size 0.01 \
        --acquire_size 0.01 --iterations 5 --acquisition ucb --ensemble_size 3 --seed 0 --save_dir runs/explore

Inside a job, Ray sets RAY_ADDRESS, so the rounds run on the cluster; a job submitted again with the same flags and
--save_dir (on storage the new driver reaches) resumes at the first round explored.csv does not hold.
"""

from __future__ import annotations

import sys

from ray_app.cli import main

if __name__ == "__main__":
    sys.exit(main(["explore", *sys.argv[1:]]))
