"""SMILES reconstruction from a cMIM or hybrid pretraining checkpoint (upstream's ``task/reconstruct.py``).

Each molecule is encoded (eval mode) to q(z|x); the decoder is conditioned on the latent mean (``use_mean``) or on
a draw z = mean + exp(log_scale)·ε per sample, and generates SMILES with :mod:`kermt.nn.pretrain.generate`. A generated
string is scored as upstream scores it: does RDKit parse it, is it the input molecule (canonical SMILES equal), and
its edit distance to the canonical input (for parsable ones). A run's validity, uniqueness and novelty are
computed by :mod:`kermt.pretrain.generation_metrics`.

Randomness: every draw is a pure function of (seed, molecule row, sample number): ε and the per-step token
uniforms come from the counter-based hashes of :mod:`kermt.pretrain.draws`. So sample k of row r is the same
whatever the batch, the number of workers, the device or ``num_samples`` (asking for more samples adds samples).
Upstream draws from the global RNG, unseeded.

Typical use::

    checkpoint = read_checkpoint("model.pt")
    vocab = read_smiles_vocab(find_smiles_vocab("model.pt"), checkpoint)
    model = Reconstructor(checkpoint, vocab)
    samples = model.reconstruct(featurize_smiles(["CCO"]), np.array([0]), ReconstructSettings(use_mean=True))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kermt.checkpoint import Checkpoint, load_pretrain_model
from kermt.chem.vocab_smiles import SmilesVocab
from kermt.data.featurize import FeaturizedMolecules
from kermt.errors import UserError
from kermt.nn.pretrain.generate import SamplingConfig, generate
from kermt.pretrain.draws import latent_noise
from kermt.pretrain.export import places_beside
from kermt.pretrain.generation_metrics import canonical_smiles
from kermt.random_streams import Stream, hashed_uniform

VOCAB_PATTERNS = ("*smiles_vocab.json", "*smiles_vocab.pkl")


@dataclass(frozen=True)
class ReconstructSettings:
    """``num_samples`` strings per molecule; ``use_mean``: condition on the latent mean instead of draws."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    use_mean: bool = False
    num_samples: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {self.num_samples}")


def check_reconstruct_checkpoint(checkpoint: Checkpoint) -> None:
    if checkpoint.spec.kind not in ("cmim", "hybrid"):
        raise UserError(f"reconstruct needs a cmim or hybrid checkpoint; {checkpoint.path} is {checkpoint.spec.kind}")


def find_smiles_vocab(checkpoint_path: str | Path) -> Path:
    """The one ``*smiles_vocab.json`` / ``*smiles_vocab.pkl`` next to the checkpoint (for a native checkpoint
    directory: inside it, else beside it)."""
    path = Path(checkpoint_path)
    for place in places_beside(path):
        found = sorted({f for pattern in VOCAB_PATTERNS for f in place.glob(pattern) if f.is_file()})
        if len(found) > 1:
            raise UserError(f"several SMILES vocabs next to {path}: {', '.join(f.name for f in found)}; choose one "
                            "with --smiles_vocab_path")
        if found:
            return found[0]
    raise UserError(f"no SMILES vocab (*smiles_vocab.json or *smiles_vocab.pkl) next to {path}; pass the one the "
                    "model was pretrained with as --smiles_vocab_path")


def read_smiles_vocab(path: str | Path, checkpoint: Checkpoint) -> SmilesVocab:
    """Our JSON or upstream's pickle (read as data), checked against the decoder's vocabulary size."""
    try:
        vocab = SmilesVocab.load(path)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"--smiles_vocab_path {path}: not a SMILES vocab ({error})") from error
    expected = checkpoint.spec.pretrain.get("smiles_vocab_size")
    if len(vocab) != expected:
        raise UserError(f"--smiles_vocab_path {path} has {len(vocab)} tokens but the decoder of {checkpoint.path} "
                        f"has {expected}; pass the vocab the model was pretrained with")
    return vocab


@dataclass(frozen=True)
class SequenceDraws:
    """The random numbers of sequences keyed (seed, ``rows``, ``samples``), both int64 [B]."""

    seed: int
    rows: np.ndarray
    samples: np.ndarray

    def _per_sample(self, draw) -> np.ndarray:
        parts = {int(s): draw(int(s), self.rows[self.samples == s]) for s in np.unique(self.samples)}
        out = np.empty((len(self.rows), *next(iter(parts.values())).shape[1:]), dtype=np.float64)
        for sample, values in parts.items():
            out[self.samples == sample] = values
        return out

    def latent_noise(self, latent_dim: int) -> torch.Tensor:
        """ε ~ N(0, I) float32 [B, latent_dim]."""
        noise = self._per_sample(lambda s, rows: latent_noise(self.seed, s, rows, latent_dim))
        return torch.from_numpy(noise.astype(np.float32))

    def uniforms(self, step: int) -> torch.Tensor:
        """Uniform [0, 1) float64 [B] for generation step ``step``."""
        values = self._per_sample(lambda s, rows: hashed_uniform(self.seed, Stream.TOKEN_DRAWS, s, rows,
                                                                  np.full(len(rows), step)))
        return torch.from_numpy(values)


@dataclass(frozen=True)
class Scored:
    """One generated string: ``parses`` (RDKit), ``exact_match`` (same canonical SMILES as the input) and the
    ``edit_distance`` to the canonical input (None when it does not parse, as upstream)."""

    smiles: str
    parses: bool
    exact_match: bool
    edit_distance: int | None
    canonical: str | None = None  # RDKit's canonical SMILES of a parsable string


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions of characters)."""
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def score(canonical_input: str, generated: str) -> Scored:
    canonical = canonical_smiles(generated)
    if canonical is None:
        return Scored(generated, False, False, None)
    return Scored(generated, True, canonical == canonical_input, edit_distance(canonical_input, generated), canonical)


class Reconstructor:
    """The latent head and decoder of a cMIM/hybrid checkpoint, in eval mode on ``device``."""

    def __init__(self, checkpoint: Checkpoint, vocab: SmilesVocab, device: torch.device | str = "cpu") -> None:
        check_reconstruct_checkpoint(checkpoint)
        model, _ = load_pretrain_model(checkpoint)
        self.device = torch.device(device)
        self.latent = model.latent_dist.to(self.device).eval()
        self.decoder = model.decoder.to(self.device).eval()
        self.vocab = vocab
        self.max_seq_len = model.heads_config.decoder_max_seq_len

    @torch.no_grad()
    def reconstruct(self, molecules: FeaturizedMolecules, rows: np.ndarray,
                    settings: ReconstructSettings) -> list[list[str]]:
        """One batch of valid molecules and their input rows [M] -> ``num_samples`` strings per molecule."""
        count, per = len(molecules), settings.num_samples
        graph = molecules.batch_graph(self.latent.kermt.aggregation_spec(training=False))  # operators on the host
        params = self.latent(graph.to(self.device))
        draws = SequenceDraws(settings.seed, np.repeat(np.asarray(rows, np.int64), per),
                              np.tile(np.arange(1, per + 1, dtype=np.int64), count))
        z = params.mean.repeat_interleave(per, dim=0)
        if not settings.use_mean:
            noise = draws.latent_noise(z.shape[1]).to(z)
            z = z + torch.exp(params.log_scale.repeat_interleave(per, dim=0)) * noise
        ids = generate(self.decoder, z, settings.sampling, draws.uniforms).cpu().tolist()
        strings = [self.vocab.decode(sequence) for sequence in ids]
        return [strings[i * per:(i + 1) * per] for i in range(count)]


__all__ = ["ReconstructSettings", "Reconstructor", "Scored", "SequenceDraws", "check_reconstruct_checkpoint",
           "edit_distance", "find_smiles_vocab", "read_smiles_vocab", "score"]
