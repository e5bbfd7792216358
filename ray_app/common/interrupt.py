"""Ctrl-C during a long run: stop cleanly, keep what can be resumed, say how to go on (no traceback).

Ray Tune catches the first SIGINT itself: it saves the experiment state and returns from ``fit()`` as if the run
had ended, so the caller cannot tell an interrupted run from a finished one and Tune prints its own
``Tuner.restore(...)`` advice, which is not how our users resume. :func:`stopping_on_ctrl_c` takes the signal
instead: the first Ctrl-C asks Tune for the same graceful stop through Tune's other stop signal (SIGUSR1, which
Tune always listens to), the second stops at once, and afterwards :class:`kermt.errors.Interrupted` carries the
command's own advice ("re-run the same command to resume") to the entry point, which prints one line and exits 130.
Around a Ray Train ``fit()`` (pretraining, ``tune=False``) Ray Train installs its own handler, which aborts the run
gracefully and then calls ``sys.exit()``; that exit becomes the same ``Interrupted``. The step checkpoints are the
resume point.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from kermt.errors import Interrupted, first_line
from ray_app.common.ray_internals import (TRAIN_SIGINT_EXIT, TUNE_INTERRUPT_MESSAGES, TUNE_LOGGER,
                                          TUNE_SIGINT_VARIABLE, TUNE_STOP_SIGNAL)


def _not_tunes_restore_advice(record: logging.LogRecord) -> bool:
    """Drop Tune's "interrupted ... Resume experiment with: Tuner.restore(...)": our advice replaces it."""
    return not str(record.msg).startswith(TUNE_INTERRUPT_MESSAGES)


@contextmanager
def stopping_on_ctrl_c(advice: str, tune: bool = True) -> Iterator[None]:
    """Inside, Ctrl-C stops the run (gracefully first, for a Tune run); leaving, it raises ``Interrupted(advice)``.
    Outside the main thread (where signals cannot be handled) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hit = threading.Event()

    def on_sigint(signum, frame) -> None:
        # Before Tune has started (no SIGUSR1 handler yet, whose default would kill the process) stop at once too
        if hit.is_set() or not tune or not callable(signal.getsignal(TUNE_STOP_SIGNAL)):
            hit.set()
            raise KeyboardInterrupt
        hit.set()
        print("Ctrl-C: stopping the run after saving its state (Ctrl-C again to stop at once)", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), TUNE_STOP_SIGNAL)  # Tune's graceful stop, which its own SIGINT handler would start

    previous_handler, previous_env = signal.signal(signal.SIGINT, on_sigint), os.environ.get(TUNE_SIGINT_VARIABLE)
    os.environ[TUNE_SIGINT_VARIABLE] = "1"  # Tune leaves SIGINT to us
    tune_logger = logging.getLogger(TUNE_LOGGER)
    tune_logger.addFilter(_not_tunes_restore_advice)
    try:
        yield
    except TRAIN_SIGINT_EXIT:
        if tune:
            raise
        # Ray Train's fit() replaces our handler with its own, which aborts the run gracefully and then calls
        # sys.exit(): nothing else in a Train fit() exits the process
        raise Interrupted(advice) from None
    except KeyboardInterrupt:
        if hit.is_set():  # the stop itself: the user stopped the run, no traceback
            raise Interrupted(advice) from None
        raise
    except Exception as error:
        if hit.is_set():  # the user stopped the run, but this may be a real bug: named, its traceback is the cause
            raise Interrupted(f"{advice} (while stopping, the run raised {type(error).__name__}: "
                              f"{first_line(error)})") from error
        raise
    finally:
        tune_logger.removeFilter(_not_tunes_restore_advice)
        signal.signal(signal.SIGINT, previous_handler)
        if previous_env is None:
            os.environ.pop(TUNE_SIGINT_VARIABLE, None)
        else:
            os.environ[TUNE_SIGINT_VARIABLE] = previous_env
    if hit.is_set():
        raise Interrupted(advice)


__all__ = ["stopping_on_ctrl_c"]
