"""`kermt predict` and `kermt eval` in this process (``--engine local``), for the tests whose subject is the same on
either engine (columns, calibration, domain, scores, molecule handling): they skip each command's Ray Data stream
and actor start. tests/ray_app/screening/test_local.py proves the two engines write the same files;
test_predict.py, test_screening_formats.py, test_carried_columns.py and test_local.py keep the streaming behaviour
(order, actors, formats, URIs) tested on Ray."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ray_app.screening import commands

IN_PROCESS = ("--engine", "local")


def _in_process(main: Callable[[list[str]], int]) -> Callable[[Sequence[str]], int]:
    def run(argv: Sequence[str]) -> int:
        return main([*argv, *IN_PROCESS])

    return run


main_predict = _in_process(commands.main_predict)
main_eval = _in_process(commands.main_eval)

__all__ = ["IN_PROCESS", "main_eval", "main_predict"]
