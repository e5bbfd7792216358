"""SMILES tokenizer and vocabulary of the cMIM decoder (docs/upstream-compatibility.md#pretraining).

Tokens come from a regex (bracket atoms, two-letter organic atoms, ring-bond labels, bond/branch symbols), with
any other single character as a fallback token. Ids 0..4 are ``<pad> <start> <end> <unk> <mask>``; a molecule is
encoded as ``<start> tokens <end>``, unknown tokens as ``<unk>``.

Files: a safe JSON form (``.json``, written by :meth:`SmilesVocab.save`) and upstream's pickled ``SMILESVocab``
(``.pkl``), read as data through :mod:`kermt.chem.vocab_pickle`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from kermt.chem.vocab_pickle import PickledPattern, read_pickled_vocab

SMILES_SPECIALS = ("<pad>", "<start>", "<end>", "<unk>", "<mask>")
PAD, START, END, UNK, MASK = range(len(SMILES_SPECIALS))

# Upstream's token pattern (kermt/data/smiles_regex.txt), kept verbatim because token ids depend on it. Note the
# doubled escaping of the backslash alternative: it matches two backslashes, so a single "\" (a bond direction)
# is tokenised by the "." fallback — same token, same id.
DEFAULT_SMILES_PATTERN = (
    r"\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\\\|\/|:|~|@|\?|>|\*|\$|\%[0-9]{2}|[0-9]"
)


@dataclass(frozen=True)
class SmilesVocab:
    """Token vocabulary: ``itos`` starts with :data:`SMILES_SPECIALS`; ``pattern`` is the token regex (without the
    any-character fallback, which is always appended); ``freqs`` are the counts it was built from."""

    itos: tuple[str, ...]
    pattern: str = DEFAULT_SMILES_PATTERN
    freqs: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if tuple(self.itos[: len(SMILES_SPECIALS)]) != SMILES_SPECIALS:
            raise ValueError(f"a SMILES vocab starts with {SMILES_SPECIALS}, got {tuple(self.itos[:5])}")
        if len(set(self.itos)) != len(self.itos):
            raise ValueError("SMILES vocab has duplicate tokens")

    @cached_property
    def stoi(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.itos)}

    @cached_property
    def _regex(self) -> re.Pattern:
        return re.compile(f"({self.pattern}|.)")

    def __len__(self) -> int:
        return len(self.itos)

    def tokenize(self, smiles: str) -> list[str]:
        return self._regex.findall(smiles)

    def encode(self, smiles: str, add_special_tokens: bool = True) -> list[int]:
        index = self.stoi.get  # bound once: this runs for every token of a corpus
        ids = [index(token, UNK) for token in self.tokenize(smiles)]
        return [START, *ids, END] if add_special_tokens else ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Join token strings; ids outside the vocab become ``<unk>``; special tokens are dropped by default."""
        tokens = [self.itos[i] if 0 <= i < len(self.itos) else "<unk>" for i in map(int, ids)]
        if skip_special_tokens:
            tokens = [t for t in tokens if t not in SMILES_SPECIALS]
        return "".join(tokens)

    @classmethod
    def build(
        cls,
        smiles: Iterable[str],
        pattern: str = DEFAULT_SMILES_PATTERN,
        max_size: int | None = None,
        min_freq: int = 1,
    ) -> "SmilesVocab":
        """Count tokens; order by count descending, ties alphabetical; cut by ``min_freq`` and ``max_size``."""
        regex = re.compile(f"({pattern}|.)")
        counts: Counter = Counter()
        for smi in smiles:
            counts.update(regex.findall(smi))
        return cls.from_counts(counts, pattern=pattern, max_size=max_size, min_freq=min_freq)

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[str, int],
        pattern: str = DEFAULT_SMILES_PATTERN,
        max_size: int | None = None,
        min_freq: int = 1,
    ) -> "SmilesVocab":
        """The vocab of already counted tokens (e.g. counts summed over a cluster), ordered and cut as ``build``."""
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        kept = [t for t, c in ranked if c >= max(min_freq, 1) and t not in SMILES_SPECIALS]
        if max_size is not None:
            kept = kept[:max_size]
        return cls(itos=SMILES_SPECIALS + tuple(kept), pattern=pattern, freqs=dict(counts))

    def to_dict(self) -> dict[str, Any]:
        return {"vocab_type": "smiles", "itos": list(self.itos), "pattern": self.pattern, "freqs": dict(self.freqs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SmilesVocab":
        if data.get("vocab_type", "smiles") != "smiles":
            raise ValueError(f"not a SMILES vocab: vocab_type {data.get('vocab_type')!r}")
        return cls(itos=tuple(data["itos"]), pattern=data["pattern"], freqs=dict(data.get("freqs", {})))

    @classmethod
    def load(cls, path: str | Path) -> "SmilesVocab":
        """``.json`` (our form) or an upstream ``.pkl`` ``SMILESVocab`` (read as data, no upstream code runs)."""
        path = Path(path)
        if path.suffix in (".pkl", ".pckl"):
            return cls.from_upstream_state(read_pickled_vocab(path).state)
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_upstream_state(cls, state: Mapping[str, Any]) -> "SmilesVocab":
        """Build from the attribute dict of an upstream ``SMILESVocab``, checking its special indices."""
        if state.get("vocab_type") != "smiles":
            raise ValueError(f"not a SMILES vocab: vocab_type {state.get('vocab_type')!r}")
        expected = {"pad_index": PAD, "start_index": START, "end_index": END, "unk_index": UNK, "mask_index": MASK}
        wrong = {k: state.get(k) for k, v in expected.items() if state.get(k) != v}
        if wrong:
            raise ValueError(f"SMILES vocab has unexpected special indices {wrong}")
        pattern = state["regex_pattern"]
        compiled = state.get("regex")
        if isinstance(compiled, PickledPattern) and compiled.pattern != f"({pattern}|.)":
            raise ValueError("SMILES vocab's compiled regex does not match its regex_pattern")
        vocab = cls(itos=tuple(state["itos"]), pattern=pattern, freqs=dict(state.get("freqs", {})))
        if dict(state.get("stoi", vocab.stoi)) != vocab.stoi:
            raise ValueError("SMILES vocab is inconsistent: 'stoi' is not the inverse of 'itos'")
        return vocab

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))


@dataclass(frozen=True)
class TokenBatch:
    """``tokens`` [B, L] int64 (``<start> … <end>``, right-padded with 0) and ``lengths`` [B]."""

    tokens: np.ndarray
    lengths: np.ndarray

    @property
    def padding_mask(self) -> np.ndarray:
        """[B, L] bool, True at padding."""
        return self.tokens == PAD


def encode_batch(smiles: Sequence[str], vocab: SmilesVocab, max_seq_len: int) -> TokenBatch:
    """Encode and right-pad a batch. Sequences longer than ``max_seq_len`` keep their first ``max_seq_len - 1``
    ids and end with ``<end>`` (upstream's truncation)."""
    if max_seq_len < 2:
        raise ValueError(f"max_seq_len must be >= 2 to hold <start> and <end>, got {max_seq_len}")
    encoded = [vocab.encode(smi) for smi in smiles]
    encoded = [ids if len(ids) <= max_seq_len else [*ids[: max_seq_len - 1], END] for ids in encoded]
    lengths = np.array([len(ids) for ids in encoded], dtype=np.int64)
    tokens = np.full((len(encoded), int(lengths.max(initial=0))), PAD, dtype=np.int64)
    for row, ids in zip(tokens, encoded):
        row[: len(ids)] = ids
    return TokenBatch(tokens=tokens, lengths=lengths)


__all__ = [
    "DEFAULT_SMILES_PATTERN",
    "END",
    "MASK",
    "PAD",
    "SMILES_SPECIALS",
    "START",
    "SmilesVocab",
    "TokenBatch",
    "UNK",
    "encode_batch",
]
