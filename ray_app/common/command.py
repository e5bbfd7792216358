"""The entry every Ray subcommand shares (`kermt finetune`, `tune`, `pretrain`, `corpus` and the screening commands).

``-h``/``--help`` prints the flags, generated from the command's settings schema. Otherwise the flags (and a
``--config`` YAML) resolve into the validated settings and where each value came from; a local output
(``--save_dir``, ``--output_path``) is checked writable, so a folder that cannot be made is one line now rather than
a traceback after the cluster started; a command that records its settings for replay (config.yaml, run.json:
``replayable``) gets its local paths made absolute, so the record replays from any directory; then the command's
body runs. Each body resolves its URI settings to local files itself
(``remote_files.local_files``: which inputs stay URIs differs), checks its inputs, and only then imports its runner
and so Ray. Errors go to the caller: ``ray_app.cli`` prints a user error as one line and exits 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from kermt.inputs import check_output_path
from ray_app.common.remote_files import OUTPUT_DIR_SETTINGS, OUTPUT_FILE_SETTINGS, with_absolute_paths
from ray_app.common.settings import Source, build_parser, resolve
from ray_app.common.storage import is_uri

Body = Callable[[Any, dict[str, Source]], "int | None"]  # (settings, their sources) -> exit status (None: 0)


def run_command(prog: str, schema: type[BaseModel], argv: list[str], body: Body, *, replayable: bool = False) -> int:
    """`prog ARGV`: the help, or ``body`` run with the settings ``argv`` resolves to; returns the exit status."""
    if any(a in ("-h", "--help") for a in argv):
        build_parser(prog, schema).print_help()
        return 0
    config, sources = resolve(argv, schema, prog)
    check_local_outputs(config)
    if replayable:
        config = with_absolute_paths(config)  # what config.yaml and run.json replay, from any directory
    status = body(config, sources)
    return 0 if status is None else status


def check_local_outputs(config: BaseModel) -> None:
    """Each local output setting the command has: its folder can be made and written (URIs are staged locally and
    uploaded, ray_app.common.remote_files)."""
    for names, directory in ((OUTPUT_DIR_SETTINGS, True), (OUTPUT_FILE_SETTINGS, False)):
        for name in names:
            value = getattr(config, name, None)
            if isinstance(value, str) and not is_uri(value):
                check_output_path(value, f"--{name}", directory=directory)


__all__ = ["Body", "check_local_outputs", "run_command"]
