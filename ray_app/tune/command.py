"""Entry point of `kermt tune` (``ray_app.cli`` dispatches here)."""

from __future__ import annotations

import sys
from pathlib import Path

from kermt.run_layout import RunLayout
from ray_app.common.command import run_command
from ray_app.common.remote_files import local_files
from ray_app.common.settings import Source
from ray_app.tune.config import SweepFailedError, TuneConfig


def main(argv: list[str]) -> int:
    """`kermt tune ARGS`: 0 when the sweep finished, 1 when no trial completed. Bad input raises
    :class:`~kermt.errors.UserError` (the entry point's guard prints it as one line, exit 2). Replayable: the
    sweep's best_config.yaml and each trial's config.yaml name absolute paths."""
    return run_command("kermt tune", TuneConfig, argv, _sweep, replayable=True)


def _sweep(config: TuneConfig, sources: dict[str, Source]) -> int:
    # imported here, not above: `kermt tune --help` loads the settings only (not pandas, pyarrow or numpy)
    from ray_app.finetune.inputs import check_finetune_inputs
    from ray_app.report import announce_report, start_line
    from ray_app.tune.resume import claim_sweep_dir

    space = config.space()
    with local_files(config) as local:  # URIs: inputs downloaded, --save_dir mirrored (ray_app/common/remote_files)
        check_finetune_inputs(local)  # the same input checks as finetune, before Ray starts
        claim_sweep_dir(local)  # the same sweep resumes; anything else there is moved aside
        if local.dry_run:  # the settings, the data checks and the plan, without Ray
            from ray_app.tune.dry_run import dry_run_tune

            dry_run_tune(local, sources, space)
            return 0
        from ray_app.tune.driver import run_tune  # Ray is imported only once the input is known to be good

        print(start_line(str(config.save_dir), of_file=False), flush=True)

        try:
            run_tune(local, sources, space)
        except SweepFailedError as error:
            print(f"kermt tune: error: {error}", file=sys.stderr)
            return 1
        finally:  # also for a stopped or failed sweep: the trials it reported
            if RunLayout(Path(local.save_dir)).all_trials.exists():
                announce_report(Path(local.save_dir), config.save_dir)
    return 0


__all__ = ["main"]
