"""`ray job submit` entry point for pretraining: `kermt corpus` (prepare once) and `kermt pretrain`, same flags.

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env jobs/runtime_env.yaml -- \
        python -m jobs.pretrain corpus --data_path s3://bucket/zinc/a.parquet s3://bucket/zinc/b.parquet \
        --save_dir s3://bucket/corpus/zinc
    ray job submit ... -- python -m jobs.pretrain --data_path s3://bucket/corpus/zinc --pretrain_mode hybrid \
        --num_workers 4-16 --use_gpu --storage_path s3://bucket/ray --save_dir s3://bucket/models/hybrid

The first argument may name the command (corpus, pretrain; default pretrain). Inside a job Ray sets RAY_ADDRESS,
so the run attaches to the cluster. Submitting the same pretrain command again resumes it from its last checkpoint.
"""

from __future__ import annotations

import sys

from ray_app.cli import main

COMMANDS = ("corpus", "pretrain")

if __name__ == "__main__":
    args = sys.argv[1:]
    command = args.pop(0) if args and args[0] in COMMANDS else "pretrain"
    sys.exit(main([command, *args]))
