"""Read upstream's pickled vocab objects as plain data, without importing or running upstream code.

Upstream pickles ``kermt.data.torchvocab.SMILESVocab`` (always) and optionally ``MolVocab`` (``.pkl`` context
vocabs; GROVER's older files name the module ``grover.data.torchvocab``). Those pickles reference exactly three
kinds of globals: the vocab class (rebuilt from an empty ``__new__`` plus a state dict), ``collections.Counter``
(token counts) and ``re._compile`` (the tokenizer regex). This unpickler maps each of them to an inert stand-in
and refuses every other global, so a tampered file fails instead of executing code.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_VOCAB_MODULES = ("kermt.data.torchvocab", "grover.data.torchvocab")
_VOCAB_CLASSES = ("SMILESVocab", "MolVocab", "TorchVocab")


@dataclass
class PickledVocab:
    """Stand-in for an upstream vocab object: its class name and the instance ``__dict__`` it was pickled with."""

    class_name: str
    state: dict[str, Any] = field(default_factory=dict)

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise pickle.UnpicklingError(f"unexpected {self.class_name} state of type {type(state).__name__}")
        self.state = state


@dataclass(frozen=True)
class PickledPattern:
    """Stand-in for a compiled regex: the pattern text and flags, never compiled here."""

    pattern: str
    flags: int = 0


def _vocab_factory(class_name: str) -> type:
    # NEWOBJ calls cls.__new__(cls) and then BUILD calls __setstate__; a subclass per name records which class it was.
    def new(cls: type) -> PickledVocab:
        return PickledVocab(class_name)

    return type(class_name, (PickledVocab,), {"__new__": new})


def _pattern(pattern: Any, flags: Any = 0) -> PickledPattern:
    if not isinstance(pattern, str) or not isinstance(flags, int):
        raise pickle.UnpicklingError("re._compile called with arguments that are not (str, int)")
    return PickledPattern(pattern, flags)


def _counter(*args: Any) -> dict:
    # Counter is pickled as REDUCE(Counter, (dict,)); a plain dict of counts is all we keep.
    if len(args) > 1 or (args and not isinstance(args[0], dict)):
        raise pickle.UnpicklingError("collections.Counter called with arguments that are not (dict,)")
    return dict(args[0]) if args else {}


class _VocabUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _VOCAB_MODULES and name in _VOCAB_CLASSES:
            return _vocab_factory(name)
        if (module, name) == ("collections", "Counter"):
            return _counter
        if (module, name) == ("re", "_compile"):
            return _pattern
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name} from a vocab pickle")


def read_pickled_vocab(path: str | Path) -> PickledVocab:
    """Load an upstream vocab pickle as a :class:`PickledVocab`; raises ``pickle.UnpicklingError`` on anything else."""
    data = Path(path).read_bytes()
    obj = _VocabUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, PickledVocab):
        raise pickle.UnpicklingError(f"{path} does not hold an upstream vocab object (got {type(obj).__name__})")
    return obj


__all__ = ["PickledPattern", "PickledVocab", "read_pickled_vocab"]
