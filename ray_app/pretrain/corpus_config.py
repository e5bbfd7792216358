"""Settings of `kermt corpus`: which files, where the corpus goes, and upstream build_vocab.py's vocab cut-offs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # kermt.data.corpus_prep imports RDKit: `kermt corpus --help` reads these settings only
    from kermt.data.corpus_prep import VocabSettings


class CorpusConfig(BaseModel):
    """Flag names follow upstream's build_vocab.py where it has them (``--vocab_min_freq``, ``--vocab_max_size``,
    ``--smiles_vocab_min_freq``, ``--smiles_vocab_max_size``). There is no seed: preparing a corpus draws nothing
    (rows keep the input order; a pretraining run shuffles with its own seed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_path: list[str] = Field(min_length=1, description="one or more CSV (also .gz/.bz2/.zst), Parquet or SMILES "
                                 "(.smi, .cxsmiles) files, local paths or URIs (s3://..., gs://...)")
    save_dir: str = Field(description="corpus directory (local path or URI); an existing corpus there is replaced")
    smiles_column: Optional[str] = Field(None, description="SMILES column (default: each file's first column)")
    canonicalize: bool = Field(True, description="store RDKit canonical SMILES, as upstream's clean_smiles.py "
                               "(--no-canonicalize keeps the input text)")
    keep_duplicates: bool = Field(False, description="keep every copy of a molecule (default: later rows with the "
                                  "canonical SMILES of an earlier one are dropped and counted in the manifest)")
    vocab_min_freq: int = Field(1, ge=1, description="atom/bond contexts seen fewer times map to <other>")
    vocab_max_size: Optional[int] = Field(None, ge=1, description="most atom/bond contexts kept (besides specials)")
    smiles_vocab_min_freq: int = Field(1, ge=1, description="SMILES tokens seen fewer times map to <unk>")
    smiles_vocab_max_size: Optional[int] = Field(None, ge=1, description="most SMILES tokens kept (besides specials)")
    atom_vocab_path: Optional[str] = Field(None, description="use this atom vocab instead of building one (e.g. a "
                                           "released model's; upstream JSON or .pkl, read safely; local file)")
    bond_vocab_path: Optional[str] = Field(None, description="use this bond vocab instead of building one")
    smiles_vocab_path: Optional[str] = Field(None, description="use this SMILES vocab instead of building one "
                                             "(upstream .pkl, read safely, or our .json)")
    rows_per_shard: int = Field(50_000, ge=1, le=10_000_000, description="molecules per Parquet shard")
    rows_per_task: int = Field(2048, ge=1, description="molecules cleaned / featurised per Ray Data task")
    address: Optional[str] = Field(None, description="Ray cluster (default: RAY_ADDRESS, else a local cluster)")
    num_cpus: Optional[int] = Field(None, ge=1, description="CPUs of a local cluster started here (default: all)")

    @property
    def vocab_paths(self) -> tuple[str | None, str | None, str | None]:
        return self.atom_vocab_path, self.bond_vocab_path, self.smiles_vocab_path

    @property
    def vocab_settings(self) -> VocabSettings:
        from kermt.data.corpus_prep import VocabSettings

        return VocabSettings(min_freq=self.vocab_min_freq, max_size=self.vocab_max_size,
                             smiles_min_freq=self.smiles_vocab_min_freq, smiles_max_size=self.smiles_vocab_max_size,
                             canonicalize=self.canonicalize, deduplicate=not self.keep_duplicates)
