"""Models on the Hugging Face Hub: the released NV-KERMT-70M-v2 (downloaded once, verified, reused) and ``hf://`` URIs.

The release is pinned to one revision so a run is reproducible. ``--model_dir`` (default
``$KERMT_CACHE/NV-KERMT-70M-v2``) holds the files plus ``release.json`` (the revision and each file's sha256): a
directory whose files still match it is reused without touching the network.

Wherever a command reads a checkpoint or a vocab, ``hf://OWNER/REPO[@REVISION][/FILE]`` names one on the Hub
(``ray_app/common/remote_files.py`` hands it here): ``hf://nvidia/NV-KERMT-70M-v2`` is the release above (its
checkpoint; ``.../pretrain_smiles_vocab.pkl`` one of its vocab files); any other repo is fetched with
huggingface_hub's own cache (a FILE, or the whole repo: e.g. a native checkpoint directory).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from kermt.errors import UserError
from ray_app.common.cache import cache_root

RELEASE_REPO = "nvidia/NV-KERMT-70M-v2"
RELEASE_REVISION = "7df5eb3179235fdea1e8124db73215da33d77dce"
CHECKPOINT_FILE = "kermt_contrastive_v2.0.pt"
RELEASE_FILES = (CHECKPOINT_FILE, "pretrain_atom_vocab.json", "pretrain_bond_vocab.json", "pretrain_smiles_vocab.pkl")
MANIFEST = "release.json"
HUB_SCHEME = "hf://"


def default_dir() -> Path:
    return cache_root() / "NV-KERMT-70M-v2"


def is_complete(directory: Path) -> bool:
    """True when the manifest names our revision and every file matches its recorded sha256."""
    from kermt.checkpoint.upstream import file_sha256  # torch: only when a release is checked

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
    from kermt.checkpoint.upstream import file_sha256  # torch: only when a release is checked
    from ray_app.common.outputs import atomic_write_text

    directory = Path(model_dir) if model_dir else default_dir()
    if is_complete(directory):
        return directory / CHECKPOINT_FILE
    from huggingface_hub import hf_hub_download

    directory.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for name in RELEASE_FILES:
        cached = Path(_download(f"{RELEASE_REPO}@{RELEASE_REVISION[:7]}", hf_hub_download, RELEASE_REPO, name,
                                revision=RELEASE_REVISION))
        staging = directory / f".{name}.tmp"
        shutil.copyfile(cached, staging)
        os.replace(staging, directory / name)
        hashes[name] = file_sha256(directory / name)
    _verify(directory / CHECKPOINT_FILE)
    manifest = {"repo": RELEASE_REPO, "revision": RELEASE_REVISION, "sha256": hashes}
    # whole or not at all: is_complete trusts a manifest, so a half-written one must never be read
    atomic_write_text(directory / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return directory / CHECKPOINT_FILE


def _verify(checkpoint: Path) -> None:
    """The download must be a hybrid KERMT checkpoint that loads without running code."""
    from kermt.checkpoint import read_checkpoint

    kind = read_checkpoint(checkpoint).spec.kind
    if kind != "hybrid":
        raise ValueError(f"{checkpoint}: expected the hybrid NV-KERMT-70M-v2 checkpoint, found kind {kind!r}")


def _download(what: str, function, *args, **kwargs) -> str:
    """A huggingface_hub download whose failure (no network, no access, no such file) is a user error."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # huggingface_hub raises many types (HTTP, offline, not found); all mean the same
        reason = " ".join(str(error).split())[:300] or type(error).__name__
        raise UserError(f"cannot download {what} from the Hugging Face Hub ({type(error).__name__}: {reason}); "
                        "check the network, HF_ENDPOINT / HF_TOKEN, or download the files elsewhere and give "
                        "their local path") from None


def parse_hub_uri(uri: str, flag: str) -> tuple[str, str | None, str]:
    """``hf://OWNER/REPO[@REVISION][/FILE]`` -> (repo id, revision or None, file path in the repo or "")."""
    parts = uri[len(HUB_SCHEME):].strip("/").split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise UserError(f"{flag} {uri}: a Hub URI is hf://OWNER/REPO[@REVISION][/FILE], e.g. "
                        f"{HUB_SCHEME}{RELEASE_REPO}")
    name, _, revision = parts[1].partition("@")
    return f"{parts[0]}/{name}", revision or None, "/".join(parts[2:])


def fetch_from_hub(uri: str, flag: str) -> str:
    """The local path of what ``uri`` names (see the module docstring)."""
    repo, revision, filename = parse_hub_uri(uri, flag)
    if repo == RELEASE_REPO and revision in (None, RELEASE_REVISION):
        if filename and filename not in RELEASE_FILES:
            raise UserError(f"{flag} {uri}: the release holds {', '.join(RELEASE_FILES)}")
        checkpoint = fetch_release()
        return str(checkpoint.parent / filename if filename else checkpoint)
    from huggingface_hub import hf_hub_download, snapshot_download

    if filename:
        return _download(uri, hf_hub_download, repo, filename, revision=revision)
    return _download(uri, snapshot_download, repo, revision=revision)
