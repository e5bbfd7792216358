"""The released NV-KERMT-70M-v2 model: download once with huggingface_hub, verify, reuse.

Pinned to one revision so a run is reproducible. ``--model_dir`` holds the files plus ``release.json`` (the
revision and each file's sha256): a directory whose files still match it is reused without touching the network.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from kermt.checkpoint.upstream import file_sha256

RELEASE_REPO = "nvidia/NV-KERMT-70M-v2"
RELEASE_REVISION = "7df5eb3179235fdea1e8124db73215da33d77dce"
CHECKPOINT_FILE = "kermt_contrastive_v2.0.pt"
RELEASE_FILES = (CHECKPOINT_FILE, "pretrain_atom_vocab.json", "pretrain_bond_vocab.json", "pretrain_smiles_vocab.pkl")
MANIFEST = "release.json"
DEFAULT_DIR = Path.home() / ".cache" / "kermt-ray" / "NV-KERMT-70M-v2"


def is_complete(directory: Path) -> bool:
    """True when the manifest names our revision and every file matches its recorded sha256."""
    manifest = directory / MANIFEST
    if not manifest.exists():
        return False
    record = json.loads(manifest.read_text())
    if record.get("revision") != RELEASE_REVISION:
        return False
    files = record.get("sha256", {})
    return all(name in files and (directory / name).exists() and file_sha256(directory / name) == files[name]
               for name in RELEASE_FILES)


def fetch_release(model_dir: str | Path | None = None) -> Path:
    """Path of the released checkpoint in ``model_dir`` (downloaded and verified on first use)."""
    directory = Path(model_dir) if model_dir else DEFAULT_DIR
    if is_complete(directory):
        return directory / CHECKPOINT_FILE
    from huggingface_hub import hf_hub_download

    directory.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for name in RELEASE_FILES:
        cached = Path(hf_hub_download(RELEASE_REPO, name, revision=RELEASE_REVISION))
        staging = directory / f".{name}.tmp"
        shutil.copyfile(cached, staging)
        os.replace(staging, directory / name)
        hashes[name] = file_sha256(directory / name)
    _verify(directory / CHECKPOINT_FILE)
    manifest = {"repo": RELEASE_REPO, "revision": RELEASE_REVISION, "sha256": hashes}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return directory / CHECKPOINT_FILE


def _verify(checkpoint: Path) -> None:
    """The download must be a hybrid KERMT checkpoint that loads without running code."""
    from kermt.checkpoint import read_checkpoint

    kind = read_checkpoint(checkpoint).spec.kind
    if kind != "hybrid":
        raise ValueError(f"{checkpoint}: expected the hybrid NV-KERMT-70M-v2 checkpoint, found kind {kind!r}")
