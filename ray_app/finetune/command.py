"""Entry point of `kermt finetune` (``ray_app.cli`` dispatches here)."""

from __future__ import annotations

from ray_app.common.command import run_command
from ray_app.common.remote_files import local_files
from ray_app.common.settings import Source
from ray_app.finetune.config import FinetuneConfig

DRIVER_TORCH_THREADS = 1


def main(argv: list[str]) -> int:
    """`kermt finetune ARGS`. Bad input raises :class:`~kermt.errors.UserError` (the entry point's guard prints it as
    one line, exit 2)."""
    return run_command("kermt finetune", FinetuneConfig, argv, _finetune, replayable=True)


def _finetune(config: FinetuneConfig, sources: dict[str, Source]) -> None:
    # imported here, not above: `kermt finetune --help` loads the settings only (not pandas or pyarrow)
    from ray_app.finetune.inputs import check_finetune_inputs
    from ray_app.finetune.model_size import oversized_model_line

    with local_files(config) as local:  # URIs: inputs downloaded, --save_dir mirrored (ray_app/common/remote_files)
        data = check_finetune_inputs(local)  # data files, labels, columns, checkpoint: before Ray starts
        oversized = oversized_model_line(local, sources, data)
        if oversized:
            print(oversized, flush=True)
        if local.dry_run:  # the settings, the data checks and the plan, without Ray
            from ray_app.finetune.dry_run import dry_run_finetune

            dry_run_finetune(local, sources)
            return
        from ray_app.finetune.run import run_finetune  # Ray is imported only once the input is known to be good
        from ray_app.common.torch_threads import torch_threads

        # The driver's own forwards (test and calibration predictions, the domain index, the report's attributions)
        # on one thread, as the training workers (1 CPU each) run: OpenMP's threads spin while they wait, and with
        # torch's default (every core) on a busy 2-core machine they took ~10x the CPU time and 7-40x the wall time
        # of one thread, with the same numbers (bench/finetune_wall.py).
        with torch_threads(DRIVER_TORCH_THREADS):
            run_finetune(local, sources, recorded=config)


__all__ = ["main"]
