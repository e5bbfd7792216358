"""--pretrained_release: the real huggingface_hub code path, served from a local offline cache built here."""

from __future__ import annotations

import shutil

import pytest

from ray_app.common import release
from tests.conftest import FIXTURE_DIR

SOURCES = {
    release.CHECKPOINT_FILE: "ckpt_pretrain_hybrid.pt",
    "pretrain_atom_vocab.json": "tiny_atom_vocab.json",
    "pretrain_bond_vocab.json": "tiny_bond_vocab.json",
    "pretrain_smiles_vocab.pkl": "tiny_smiles_vocab.pkl",
}


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """A huggingface_hub cache holding the pinned revision, and no network (HF_HUB_OFFLINE)."""
    cache = tmp_path / "hub"
    repo = cache / ("models--" + release.RELEASE_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / release.RELEASE_REVISION
    snapshot.mkdir(parents=True)
    for name, fixture in SOURCES.items():
        shutil.copyfile(FIXTURE_DIR / fixture, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(release.RELEASE_REVISION)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return snapshot


def test_fetch_copies_verifies_and_reuses(offline_hub, tmp_path):
    model_dir = tmp_path / "model"
    path = release.fetch_release(model_dir)
    assert path == model_dir / release.CHECKPOINT_FILE
    assert path.read_bytes() == (FIXTURE_DIR / "ckpt_pretrain_hybrid.pt").read_bytes()
    assert release.is_complete(model_dir)
    # reused when complete: even with the cache gone, nothing is fetched again
    shutil.rmtree(offline_hub)
    assert release.fetch_release(model_dir) == path


def test_a_corrupted_file_is_fetched_again(offline_hub, tmp_path):
    model_dir = tmp_path / "model"
    release.fetch_release(model_dir)
    (model_dir / "pretrain_atom_vocab.json").write_text("{}")
    assert not release.is_complete(model_dir)
    release.fetch_release(model_dir)
    assert release.is_complete(model_dir)


def test_a_download_that_is_not_the_hybrid_model_is_refused(offline_hub, tmp_path):
    shutil.copyfile(FIXTURE_DIR / "ckpt_ft_reg.pt", offline_hub / release.CHECKPOINT_FILE)
    with pytest.raises(ValueError, match="expected the hybrid"):
        release.fetch_release(tmp_path / "model")
    assert not release.is_complete(tmp_path / "model")
