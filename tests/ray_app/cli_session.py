"""Run several `kermt` commands in one fresh local Ray session, in a process of its own.

Tests whose Ray workers must see environment variables the test sets (S3 credentials and endpoint: Ray workers
inherit the environment of the process that started Ray, not the driver's later changes) run their commands here:
``python -m tests.ray_app.cli_session '[["finetune", ...], ["tune", ...]]'``. Each command's exit status is
printed as ``EXIT <n>``; the session stops at the first failing command.

A step ``["pause"]`` prints ``PAUSED`` and waits for a line on stdin: a test checks and changes what the commands
before it left (and then lets the same session re-run them) without starting a second Ray session (~10-20 s).
"""

from __future__ import annotations

import json
import sys

PAUSE = ["pause"]
PAUSED = "PAUSED"


def main(commands: list[list[str]]) -> int:
    from ray_app.cli import main as cli_main
    from ray_app.common.cluster import connect

    connect(num_cpus=4, object_store_mb=256)  # as tests/ray_app/conftest.py: 4 logical CPUs on a 2-core machine
    for argv in commands:
        if argv == PAUSE:
            print(PAUSED, flush=True)
            sys.stdin.readline()
            continue
        status = cli_main(argv)
        print(f"EXIT {status}", flush=True)
        if status:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
