"""User errors that Ray wrapped: find the :class:`kermt.errors.UserError` inside a task, actor, Ray Data or Ray
Train failure, so every entry point can print it as one line instead of a traceback."""

from __future__ import annotations

from kermt.errors import UserError
from ray_app.common.ray_internals import lost_user_code_cause, wrapped_exceptions


def ray_causes(error: BaseException) -> list[BaseException]:
    """Exceptions a Ray error wraps: a task's or actor's ``cause`` (RayTaskError, and the dual classes Ray raises
    that subclass the cause's class), Ray Train's per-worker failures and controller failure.

    Ray Data wraps an exception raised in a map function in a ``UserCodeException`` whose own cause does not
    survive the trip to the driver; only the remote traceback text does. There the user error is rebuilt from its
    ``<module>.<class>: <message>`` line (the message's first line)."""
    causes = wrapped_exceptions(error)
    if lost_user_code_cause(error):
        causes.append(user_error_from_traceback(str(error)))
    return [c for c in causes if isinstance(c, BaseException) and c is not error]


def user_error_from_traceback(text: str) -> UserError | None:
    """The first ``<qualified UserError class>: <message>`` line of a traceback text, as a UserError."""
    names, pending = set(), [UserError]
    while pending:
        cls = pending.pop()
        names.add(f"{cls.__module__}.{cls.__qualname__}")
        pending.extend(cls.__subclasses__())
    for line in text.splitlines():
        head, separator, message = line.partition(": ")
        if separator and head.strip() in names:
            return UserError(message.strip())
    return None


__all__ = ["ray_causes", "user_error_from_traceback"]
