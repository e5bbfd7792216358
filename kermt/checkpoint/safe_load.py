"""Reading pickled ``.pt`` checkpoints without running code from them.

Upstream KERMT (and GROVER before it) saves checkpoints with ``torch.save`` of a dict holding an ``argparse.Namespace``
and numpy scaler arrays, and loads them with ``weights_only=False``: opening a file from the internet runs whatever its
pickle says (docs/architecture.md#checkpoints-are-data). Here the default is ``torch.load(weights_only=True)`` with an
explicit allowlist of the few plain-data globals those files contain, active only for the duration of one load (a
context manager, not process-wide state). Full unpickling needs ``trust_pickle=True``.
"""

from __future__ import annotations

import argparse
import codecs
import collections
import pickle
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.serialization import get_unsafe_globals_in_checkpoint, safe_globals

from kermt.errors import UserError

# One entry per global that upstream checkpoints pickle. Each only rebuilds plain data (no attribute lookups on
# arbitrary objects, no callables of the file's choosing). numpy 1.x wrote ``numpy.core.*``; numpy 2 writes
# ``numpy._core.*``: both names map to the same function, so both are listed by name.
_NUMPY_DTYPE_CLASSES = [
    type(np.dtype(code))
    for code in ("?", "b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "e", "f", "d", "g", "O", "U", "S")
]
_ALLOWED: list[Callable | tuple[Callable, str]] = [
    argparse.Namespace,
    collections.OrderedDict,
    codecs.encode,
    np.ndarray,
    np.dtype,
    *_NUMPY_DTYPE_CLASSES,
    (np._core.multiarray._reconstruct, "numpy._core.multiarray._reconstruct"),
    (np._core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
    (np._core.multiarray.scalar, "numpy._core.multiarray.scalar"),
    (np._core.multiarray.scalar, "numpy.core.multiarray.scalar"),
]


def _global_name(entry: Callable | tuple[Callable, str]) -> str:
    if isinstance(entry, tuple):
        return entry[1]
    return f"{entry.__module__}.{entry.__qualname__}"


ALLOWED_GLOBALS: frozenset[str] = frozenset(_global_name(entry) for entry in _ALLOWED)


class UnsafeCheckpointError(UserError, pickle.UnpicklingError):
    """A checkpoint's pickle references a global outside the allowlist; nothing from it was executed."""


class UnreadableCheckpointError(UserError):
    """A file that looks like a checkpoint but torch cannot read (truncated, corrupt, not a torch.save file)."""


def load_pickled_checkpoint(path: str | Path, *, trust_pickle: bool = False) -> dict[str, Any]:
    """Load a ``torch.save`` checkpoint onto the CPU.

    By default only tensors, containers, ``argparse.Namespace`` and numpy arrays/scalars are rebuilt; any other
    global makes this raise :class:`UnsafeCheckpointError` naming the file and the global, before anything runs.
    ``trust_pickle=True`` performs a full unpickle (only for files you trust: it can run arbitrary code).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path} does not exist or is not a file; check the path")
    if trust_pickle:
        with _unreadable_as_user_error(path):
            state = torch.load(path, map_location="cpu", weights_only=False)
    else:
        _refuse_unlisted_globals(path)
        with _unreadable_as_user_error(path):
            try:
                with safe_globals(_ALLOWED):
                    state = torch.load(path, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as error:  # legacy (non-zip) files are not pre-scanned
                if "GLOBAL" not in str(error) and "Unsupported global" not in str(error):
                    raise
                raise _unsafe_error(path, _offending_from_message(str(error))) from None
    if not isinstance(state, dict):
        raise UserError(f"checkpoint {path} holds a {type(state).__name__}, expected a dict of model entries; "
                        "pass a checkpoint saved by KERMT, GROVER or kermt")
    return state


@contextmanager
def _unreadable_as_user_error(path: Path) -> Iterator[None]:
    """torch's errors for a file it cannot read (truncated zip, corrupt pickle) as one that names the file. Any
    exception counts: what torch.load raises for damaged bytes varies (RuntimeError, EOFError, struct.error, ...)."""
    try:
        yield
    except UserError:
        raise
    except Exception as error:  # any exception: see the docstring
        raise UnreadableCheckpointError(
            f"checkpoint {path} cannot be read ({_torch_reason(error)}); the file is truncated or corrupt: copy or "
            "download it again") from error


def _torch_reason(error: BaseException) -> str:
    """The informative part of torch's message: the weights-only unpickler's reason, else the first sentence."""
    text = str(error)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].strip().split("\n\n")[0]
    text = " ".join(text.split())
    return (text.split(". ")[0].rstrip(".") or type(error).__name__)[:160]


def _refuse_unlisted_globals(path: Path) -> None:
    """Scan the pickle opcodes (no execution) of a zip-format checkpoint and refuse unlisted globals."""
    try:
        found = get_unsafe_globals_in_checkpoint(path)
    except (RuntimeError, ValueError, EOFError, pickle.UnpicklingError):
        return  # not zip format, or damaged: torch.load refuses unlisted globals itself, or reports the damage
    offending = [name for name in found if name not in ALLOWED_GLOBALS]
    if offending:
        raise _unsafe_error(path, offending)


def _offending_from_message(message: str) -> list[str]:
    names = re.findall(r"GLOBAL ([\w.]+)", message)
    return names or [message.splitlines()[0] if message else "unknown"]


def _unsafe_error(path: Path, offending: list[str]) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"refusing to load checkpoint {path}: its pickle references {', '.join(offending)}, which is not "
        "plain checkpoint data (loading it could run code). Nothing was executed. If you trust this file, "
        "load it with trust_pickle=True (CLI: --trust_checkpoint)."
    )


__all__ = ["ALLOWED_GLOBALS", "UnreadableCheckpointError", "UnsafeCheckpointError", "load_pickled_checkpoint"]
