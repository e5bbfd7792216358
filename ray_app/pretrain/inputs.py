"""Checks of a `kermt pretrain` command's inputs, before Ray starts: the corpus, the vocabularies the mode needs,
and the checkpoint to continue from. Each problem is one UserError naming the file and what to do."""

from __future__ import annotations

from dataclasses import dataclass

from kermt.checkpoint import Checkpoint, read_checkpoint
from kermt.chem.vocab_context import ContextVocab
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.data.corpus import Corpus, open_corpus
from kermt.errors import UserError
from ray_app.pretrain.config import PretrainConfig

# The modes a checkpoint of each kind may continue as (a vocab model gains a fresh latent head and decoder).
CONTINUES_AS = {"vocab": ("vocab", "hybrid"), "cmim": ("cmim",), "hybrid": ("hybrid",)}


@dataclass(frozen=True)
class PretrainInputs:
    corpus: Corpus
    vocab_sizes: dict[str, int]  # PretrainHeadsConfig field name -> size
    continue_from: Checkpoint | None

    @property
    def vocabs(self) -> dict[str, ContextVocab | SmilesVocab]:
        """The corpus's vocabularies that the mode's heads use: {"atom": ..., "bond": ..., "smiles": ...}."""
        kinds = [name.removesuffix("_vocab_size") for name in self.vocab_sizes]
        return {kind: getattr(self.corpus, f"{kind}_vocab") for kind in kinds}


def _check_vocab(corpus: Corpus, kind: str, given: str | None, expected: ContextVocab | SmilesVocab) -> None:
    """A vocab given by path must be the corpus's: the corpus's labels and tokens are ids in its own vocab."""
    if given is None:
        return
    try:
        loaded = SmilesVocab.load(given) if kind == "smiles" else ContextVocab.load(given)
    except (OSError, ValueError, KeyError) as error:
        raise UserError(f"--{kind}_vocab_path {given}: cannot read it ({error})") from None
    if tuple(loaded.itos) != tuple(expected.itos):
        raise UserError(f"--{kind}_vocab_path {given}: differs from the {kind} vocabulary of the corpus "
                        f"{corpus.path} ({len(loaded)} vs {len(expected)} entries), whose labels were computed with "
                        f"its own; drop the flag, or prepare a corpus with `kermt corpus` for this vocabulary")


def _continue_from(config: PretrainConfig, sizes: dict[str, int]) -> Checkpoint | None:
    if config.continue_from is None:
        return None
    checkpoint = read_checkpoint(config.continue_from, trust_pickle=config.trust_checkpoint)
    kind = checkpoint.spec.kind
    if config.pretrain_mode not in CONTINUES_AS.get(kind, ()):
        allowed = ", ".join(f"{k} -> {' or '.join(v)}" for k, v in CONTINUES_AS.items())
        raise UserError(f"--continue_from {config.continue_from}: a {kind} checkpoint cannot continue as "
                        f"--pretrain_mode {config.pretrain_mode}; give a pretraining checkpoint that can ({allowed})")
    for name, size in sizes.items():
        stored = checkpoint.spec.pretrain.get(name)
        if stored is not None and stored != size:
            raise UserError(f"--continue_from {config.continue_from}: its heads have {name}={stored} but the corpus's "
                            f"vocabulary has {size} entries; use the corpus prepared with that checkpoint's "
                            "vocabularies")
    return checkpoint


def check_pretrain_inputs(config: PretrainConfig) -> PretrainInputs:
    corpus = open_corpus(config.data_path)
    if corpus.manifest.n_molecules == 0:
        raise UserError(f"{config.data_path}: the corpus holds no valid molecule (see its "
                        f"{corpus.manifest.invalid_report}); prepare it from files with valid SMILES")
    _check_vocab(corpus, "atom", config.atom_vocab_path, corpus.atom_vocab)
    _check_vocab(corpus, "bond", config.bond_vocab_path, corpus.bond_vocab)
    _check_vocab(corpus, "smiles", config.smiles_vocab_path, corpus.smiles_vocab)
    sizes = {}
    wanted = ("atom", "bond") if config.pretrain_mode != "cmim" else ()
    wanted += ("smiles",) if config.pretrain_mode != "vocab" else ()
    for kind in wanted:
        vocab = getattr(corpus, f"{kind}_vocab")
        if len(vocab) <= (5 if kind == "smiles" else 2):  # nothing beyond the special entries
            raise UserError(f"--pretrain_mode {config.pretrain_mode} needs a {kind} vocabulary, but the corpus "
                            f"{config.data_path} has an empty one; prepare the corpus again with `kermt corpus`")
        sizes[f"{kind}_vocab_size"] = len(vocab)
    return PretrainInputs(corpus, sizes, _continue_from(config, sizes))


__all__ = ["CONTINUES_AS", "PretrainInputs", "check_pretrain_inputs"]
