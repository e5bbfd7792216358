"""User errors: bad input (a data file, a label, a checkpoint, a setting) as opposed to a bug in kermt.

Code that detects bad input raises :class:`UserError` (or a subclass) with a message naming the file, row,
column or key and what to do. Entry points (``kermt ...``, ``python -m jobs....``) print it as one line,
``kermt <command>: error: <message>``, and exit with status 2; anything else keeps its traceback, because it is a
bug. ``UserError`` subclasses ``ValueError`` so code that already catches ``ValueError`` keeps working.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # the shell's status for a process stopped by SIGINT (128 + 2)

# What library code raises for bad input it was handed: a wrong value or setting, a missing or unreadable file,
# a file that is not a pickle/checkpoint. Only converted where the caller knows the input is the user's.
INPUT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, pickle.UnpicklingError,
)


class UserError(ValueError):
    """Bad user input. The message is what the user reads: name the file/row/column/key and what to do."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, after the run kept what it could. The message says what is kept and how to go on."""


@contextmanager
def user_input(context: str | None = None) -> Iterator[None]:
    """Inside, :data:`INPUT_ERRORS` become :class:`UserError` (``context: message`` when a context is given).

    Use it around code that only reads what the user gave (settings, files, checkpoints), before any work starts,
    so that a ``ValueError`` raised there by library code is known to be about the input, not a bug."""
    try:
        yield
    except UserError:
        raise
    except INPUT_ERRORS as error:
        message = str(error) or type(error).__name__
        raise UserError(f"{context}: {message}" if context else message) from error


def one_line(message: str) -> str:
    """A message on one line: its lines joined by '; ' (after a trailing ':' by a space)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    out = ""
    for line in lines:
        out += line if not out else (" " if out.endswith(":") else "; ") + line
    return out


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (its type when it has none): enough to name it in a one-line message,
    where the whole text may be a remote traceback."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def wrapped_causes(error: BaseException) -> list[BaseException]:
    """The exceptions ``error`` reports as its cause: ``raise ... from cause``, and a context hidden with
    ``raise ... from None`` (a wrapper that replaced the original). A context that was not hidden is a new error
    raised while handling the old one, so it is not followed."""
    if error.__cause__ is not None:
        return [error.__cause__]
    if error.__suppress_context__ and error.__context__ is not None:
        return [error.__context__]
    return []


def find_cause(
    error: BaseException, accept: Callable[[BaseException], bool],
    unwrap: Callable[[BaseException], list[BaseException]] = lambda e: [],
) -> BaseException | None:
    """The first exception among ``error`` and its causes (see :func:`wrapped_causes`) for which ``accept`` is true.

    ``unwrap(e)`` lists further causes a framework keeps elsewhere (Ray's task and worker errors); when it names
    any, ``e`` itself is a wrapper and is not tested (Ray's wrapper classes subclass the cause's class but carry
    the remote traceback as their message)."""
    queue, seen = [error], set()
    while queue:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        inner = unwrap(current)
        if not inner and accept(current):
            return current
        queue.extend(inner + wrapped_causes(current))
    return None


def find_user_error(
    error: BaseException, unwrap: Callable[[BaseException], list[BaseException]] = lambda e: [],
) -> BaseException | None:
    """The :class:`UserError` that ``error`` is or was caused by, else None."""
    return find_cause(error, lambda e: isinstance(e, UserError), unwrap)


def run_reporting_user_errors(
    prog: str, run: Callable[[], int],
    unwrap: Callable[[BaseException], list[BaseException]] = lambda e: [],
) -> int:
    """``run()``; a user error (also one wrapped by another exception) is printed as one line
    ``<prog>: error: <message>`` on stderr and gives exit status 2; Ctrl-C prints ``<prog>: interrupted`` (with what
    an :class:`Interrupted` says) and gives 130. Other exceptions propagate (a traceback)."""
    try:
        return run()
    except KeyboardInterrupt as interrupt:  # Ctrl-C is the user's choice, not a bug: no traceback
        detail = one_line(str(interrupt)) if isinstance(interrupt, Interrupted) else ""
        print(f"{prog}: interrupted" + (f"; {detail}" if detail else ""), file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Exception as error:
        found = find_user_error(error, unwrap)
        if found is None:
            raise
        print(f"{prog}: error: {one_line(str(found))}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR


__all__ = ["EXIT_INTERRUPTED", "EXIT_USER_ERROR", "INPUT_ERRORS", "Interrupted", "UserError", "find_cause",
           "find_user_error", "first_line", "one_line", "run_reporting_user_errors", "user_input", "wrapped_causes"]
