"""`ray job submit` entry point: the screening commands (`kermt predict|eval|fingerprint|embed|reconstruct` flags).

    ray job submit --address http://HEAD:8265 --working-dir . --runtime-env jobs/runtime_env.yaml -- \
        python -m jobs.predict --data_path s3://bucket/library.parquet --checkpoint_dir s3-synced/run \
        --output_path /shared/preds.parquet --use_gpu --concurrency 4

    python -m jobs.predict fingerprint --data_path ... --checkpoint_path model.pt --output_path fps.npz
    python -m jobs.predict embed --data_path ... --checkpoint_path model.pt --output_path emb.parquet
    python -m jobs.predict eval --data_path labelled.csv --checkpoint_dir run --output_path test_result.csv
    python -m jobs.predict reconstruct --data_path ... --checkpoint_path hybrid.pt --output_path recon.parquet

The first argument may name the command (predict, eval, fingerprint, embed, reconstruct; default predict). Inside a job
Ray sets RAY_ADDRESS, so the run attaches to the cluster instead of starting a local one. Input paths must be readable
by the workers (shared filesystem or URI); checkpoints are read by the driver and shipped to the actors.
"""

from __future__ import annotations

import sys

from ray_app.cli import main

COMMANDS = ("predict", "eval", "fingerprint", "embed", "reconstruct")

if __name__ == "__main__":
    args = sys.argv[1:]
    command = args.pop(0) if args and args[0] in COMMANDS else "predict"
    sys.exit(main([command, *args]))
