"""Entry point of `kermt explore` (``ray_app.cli`` dispatches here)."""

from __future__ import annotations

from pathlib import Path

from kermt.run_layout import RunLayout
from ray_app.common.command import run_command
from ray_app.common.settings import Source
from ray_app.explore.config import ExploreConfig


def main(argv: list[str]) -> int:
    """`kermt explore ARGS`. Bad input raises :class:`~kermt.errors.UserError` (the entry point's guard prints it as
    one line, exit 2)."""
    return run_command("kermt explore", ExploreConfig, argv, _explore, replayable=True)


def _explore(config: ExploreConfig, sources: dict[str, Source]) -> None:
    from ray_app.explore.run import run_explore  # pandas, pyarrow, Ray: once the flags are known to be good

    explored = run_explore(config)
    print(f"explored: {RunLayout(Path(config.save_dir)).explored} ({len(explored):,} molecules)", flush=True)


__all__ = ["main"]
