"""The entry every Ray subcommand shares (`kermt finetune`, `tune`, `pretrain`, `corpus` and the screening commands).

``-h``/``--help`` prints the flags, generated from the command's settings schema. Otherwise the flags (and a
``--config`` YAML) resolve into the validated settings and where each value came from; a command that records its
settings for replay (config.yaml, run.json: ``replayable``) gets its local paths made absolute, so the record
replays from any directory; then the command's body runs. Each body resolves its URI settings to local files itself
(``remote_files.local_files``: which inputs stay URIs differs), checks its inputs, and only then imports its runner
and so Ray. Errors go to the caller: ``ray_app.cli`` prints a user error as one line and exits 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from ray_app.common.remote_files import with_absolute_paths
from ray_app.common.settings import Source, build_parser, resolve

Body = Callable[[Any, dict[str, Source]], "int | None"]  # (settings, their sources) -> exit status (None: 0)


def run_command(prog: str, schema: type[BaseModel], argv: list[str], body: Body, *, replayable: bool = False) -> int:
    """`prog ARGV`: the help, or ``body`` run with the settings ``argv`` resolves to; returns the exit status."""
    if any(a in ("-h", "--help") for a in argv):
        build_parser(prog, schema).print_help()
        return 0
    config, sources = resolve(argv, schema, prog)
    if replayable:
        config = with_absolute_paths(config)  # what config.yaml and run.json replay, from any directory
    status = body(config, sources)
    return 0 if status is None else status


__all__ = ["Body", "run_command"]
