"""Ctrl-C: real SIGINTs sent to this process. A stand-in for Tune's loop listens to SIGUSR1 as Tune does (Tune
always installs that handler when its run starts); the end-to-end finetune case is in
tests/ray_app/finetune/test_interrupt.py."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from kermt.errors import EXIT_INTERRUPTED, Interrupted, run_reporting_user_errors
from ray_app.common.interrupt import stopping_on_ctrl_c

ADVICE = "the last epoch is kept; re-run the same command to resume"


def _tune_like_loop(stop: threading.Event, interrupts: int) -> str:
    """Install a SIGUSR1 handler as Tune's run does, send ourselves ``interrupts`` SIGINTs, and run until told to
    stop; returns how it ended."""
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: stop.set())
    try:
        for _ in range(interrupts):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # signal handlers run between bytecodes of the main thread
        deadline = time.monotonic() + 5
        while not stop.is_set():
            assert time.monotonic() < deadline, "the graceful stop never reached the loop"
            time.sleep(0.01)
        return "stopped gracefully"
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_first_ctrl_c_asks_tune_to_stop_gracefully_then_says_how_to_resume():
    before = signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    with pytest.raises(Interrupted, match=ADVICE):
        with stopping_on_ctrl_c(ADVICE):
            assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"
            assert _tune_like_loop(stop, interrupts=1) == "stopped gracefully"
    assert stop.is_set()
    assert signal.getsignal(signal.SIGINT) is before and "TUNE_DISABLE_SIGINT_HANDLER" not in os.environ


def test_second_ctrl_c_stops_at_once():
    with pytest.raises(Interrupted, match=ADVICE):
        with stopping_on_ctrl_c(ADVICE):
            signal.signal(signal.SIGUSR1, lambda signum, frame: None)  # a Tune that never gets to stop
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
                pytest.fail("the second Ctrl-C did not stop the run")
            finally:
                signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def test_ctrl_c_before_tune_started_or_around_train_stops_at_once_without_sigusr1():
    # SIGUSR1's default action would kill the process: with no handler for it, the first Ctrl-C raises instead.
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    for tune in (True, False):
        with pytest.raises(Interrupted, match=ADVICE):
            with stopping_on_ctrl_c(ADVICE, tune=tune):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
                pytest.fail("Ctrl-C did not stop the run")


def test_a_run_that_finishes_or_fails_on_its_own_is_not_an_interrupt():
    with stopping_on_ctrl_c(ADVICE):
        pass
    with pytest.raises(RuntimeError, match="a bug"):
        with stopping_on_ctrl_c(ADVICE):
            raise RuntimeError("a bug")


def test_a_real_error_after_ctrl_c_is_named_and_kept_as_the_cause():
    """The stop is still the story (one line, exit 130), but a bug that surfaced while stopping is not dropped."""
    stop = threading.Event()
    with pytest.raises(Interrupted) as raised:
        with stopping_on_ctrl_c(ADVICE):
            _tune_like_loop(stop, interrupts=1)
            raise ValueError("a real bug\n  with a second line")
    assert str(raised.value) == f"{ADVICE} (while stopping, the run raised ValueError: a real bug)"
    assert isinstance(raised.value.__cause__, ValueError) and raised.value.__cause__.__traceback__ is not None


def test_the_entry_point_prints_one_line_and_exits_130(capsys):
    def run() -> int:
        raise Interrupted(ADVICE)

    assert run_reporting_user_errors("kermt finetune", run) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == f"kermt finetune: interrupted; {ADVICE}\n"

    def plain() -> int:
        raise KeyboardInterrupt

    assert run_reporting_user_errors("kermt predict", plain) == 130
    assert capsys.readouterr().err == "kermt predict: interrupted\n"


def test_ray_trains_own_sigint_exit_is_an_interrupt_around_a_train_fit():
    # Ray Train's fit() installs its own SIGINT handler: it aborts the run, then calls sys.exit(0).
    def trains_handler(signum, frame):
        raise SystemExit(0)

    with pytest.raises(Interrupted, match=ADVICE):
        with stopping_on_ctrl_c(ADVICE, tune=False):
            signal.signal(signal.SIGINT, trains_handler)  # as TorchTrainer.fit() does in the main thread
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            pytest.fail("Ray Train's handler did not end the run")
    assert signal.getsignal(signal.SIGINT) is not trains_handler  # ours and Train's are gone again
    with pytest.raises(SystemExit):  # around a Tune run a SystemExit is not ours to reinterpret
        with stopping_on_ctrl_c(ADVICE):
            raise SystemExit(3)
