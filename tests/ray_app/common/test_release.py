"""--pretrained_release and hf:// URIs: the real huggingface_hub code path, served from a local offline cache built
here (HF_HUB_OFFLINE: nothing reaches the network)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kermt.errors import UserError
from ray_app.common import release
from ray_app.common.remote_files import fetch_input
from tests.conftest import FIXTURE_DIR
from tests.ray_app.screening import test_reconstruct as reconstruct

SOURCES = {
    release.CHECKPOINT_FILE: "ckpt_pretrain_hybrid.pt",
    "pretrain_atom_vocab.json": "tiny_atom_vocab.json",
    "pretrain_bond_vocab.json": "tiny_bond_vocab.json",
    "pretrain_smiles_vocab.pkl": "tiny_smiles_vocab.pkl",
}


OTHER_REPO, OTHER_REVISION = "someone/finetuned-kermt", "0123456789abcdef0123456789abcdef01234567"


def _cached_repo(cache, repo_id: str, revision: str, files: dict[str, str]):
    """A repo snapshot in huggingface_hub's cache layout, with refs/main pointing at it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, fixture in files.items():
        shutil.copyfile(FIXTURE_DIR / fixture, snapshot / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """A huggingface_hub cache holding the pinned revision of the release and another repo, and no network."""
    cache = tmp_path / "hub"
    snapshot = _cached_repo(cache, release.RELEASE_REPO, release.RELEASE_REVISION, SOURCES)
    _cached_repo(cache, OTHER_REPO, OTHER_REVISION, {"model.pt": "ckpt_ft_reg.pt"})
    monkeypatch.setenv("KERMT_CACHE", str(tmp_path / "kermt_cache"))
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


def test_the_manifest_is_replaced_whole_never_rewritten_in_place(offline_hub, tmp_path):
    """A reader that opened release.json before a re-fetch keeps reading the old, complete manifest: the new one is
    a new file moved into place (rewriting it in place would truncate what the reader sees)."""
    model_dir = tmp_path / "model"
    release.fetch_release(model_dir)
    older = {"repo": release.RELEASE_REPO, "revision": "0" * 40, "sha256": {}}  # as an earlier release left it
    (model_dir / release.MANIFEST).write_text(json.dumps(older))
    with open(model_dir / release.MANIFEST) as reader:
        release.fetch_release(model_dir)  # not our revision: fetched again, and the manifest written anew
        assert json.loads(reader.read()) == older
    assert json.loads((model_dir / release.MANIFEST).read_text())["revision"] == release.RELEASE_REVISION
    assert sorted(p.name for p in model_dir.iterdir()) == sorted([*release.RELEASE_FILES, release.MANIFEST])


def test_a_download_that_is_not_the_hybrid_model_is_refused(offline_hub, tmp_path):
    shutil.copyfile(FIXTURE_DIR / "ckpt_ft_reg.pt", offline_hub / release.CHECKPOINT_FILE)
    with pytest.raises(ValueError, match="expected the hybrid"):
        release.fetch_release(tmp_path / "model")
    assert not release.is_complete(tmp_path / "model")


def test_hf_uris_name_the_release_its_files_and_other_repos(offline_hub, tmp_path):
    checkpoint = fetch_input("hf://nvidia/NV-KERMT-70M-v2", "--checkpoint_path")
    assert checkpoint == str(tmp_path / "kermt_cache" / "NV-KERMT-70M-v2" / release.CHECKPOINT_FILE)  # $KERMT_CACHE
    assert open(checkpoint, "rb").read() == (FIXTURE_DIR / "ckpt_pretrain_hybrid.pt").read_bytes()
    vocab = fetch_input(f"hf://nvidia/NV-KERMT-70M-v2@{release.RELEASE_REVISION}/pretrain_smiles_vocab.pkl", "--v")
    assert open(vocab, "rb").read() == (FIXTURE_DIR / "tiny_smiles_vocab.pkl").read_bytes()
    other = fetch_input(f"hf://{OTHER_REPO}/model.pt", "--checkpoint_path")
    assert open(other, "rb").read() == (FIXTURE_DIR / "ckpt_ft_reg.pt").read_bytes()
    assert (tmp_path / "hub") in Path(other).parents  # huggingface_hub's own cache
    snapshot = fetch_input(f"hf://{OTHER_REPO}@{OTHER_REVISION}", "--checkpoint_dir")  # a whole repo: a directory
    assert sorted(p.name for p in Path(snapshot).iterdir()) == ["model.pt"]


@pytest.mark.parametrize("uri, message", [
    ("hf://nvidia", "a Hub URI is hf://OWNER/REPO[@REVISION][/FILE]"),
    ("hf://nvidia/NV-KERMT-70M-v2/model.pt", "the release holds kermt_contrastive_v2.0.pt, pretrain_atom_vocab"),
    ("hf://someone/not-cached/model.pt", "cannot download hf://someone/not-cached/model.pt from the Hugging Face "
                                         "Hub (LocalEntryNotFoundError"),
])
def test_a_hub_uri_that_cannot_be_served_is_a_user_error(offline_hub, uri, message):
    with pytest.raises(UserError, match="^--checkpoint_path " if "cannot" not in message else "^cannot") as caught:
        fetch_input(uri, "--checkpoint_path")
    assert message in str(caught.value)


def test_the_release_download_failing_is_a_user_error_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("KERMT_CACHE", str(tmp_path / "kermt_cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_hub"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match=f"cannot download {release.RELEASE_REPO}@7df5eb3 from the Hugging Face Hub"):
        release.fetch_release()
    assert not release.is_complete(tmp_path / "kermt_cache" / "NV-KERMT-70M-v2")


def test_reconstruct_from_the_releases_hub_uri_finds_the_vocab_beside_it(offline_hub, tmp_path):
    # The URI alone is enough: the release's SMILES vocab is found next to the downloaded checkpoint. What
    # reconstruct does with a checkpoint and vocab once planned is tests/ray_app/screening/test_reconstruct.py's.
    from kermt.pretrain.reconstruct import read_smiles_vocab
    from ray_app.common.remote_files import local_files
    from ray_app.screening.config import ReconstructConfig
    from ray_app.screening.reconstruct import plan_reconstruct

    reconstruct._input(tmp_path / "in.csv")
    config = ReconstructConfig(data_path=str(tmp_path / "in.csv"), output_path=str(tmp_path / "out.csv"),
                               checkpoint_path="hf://nvidia/NV-KERMT-70M-v2")
    with local_files(config, keep_remote=("data_path",)) as local:
        plan = plan_reconstruct(local)
    assert plan.checkpoint.spec.kind == "hybrid"
    assert plan.vocab == read_smiles_vocab(FIXTURE_DIR / "tiny_smiles_vocab.pkl", plan.checkpoint)


def test_a_corpus_labelled_with_the_releases_vocab_files_by_their_hub_uris(offline_hub, ray_cluster, tmp_path):
    # Continued pretraining of the release starts with a corpus labelled by its vocabularies.
    from kermt.chem.vocab_context import ContextVocab
    from kermt.data.corpus import open_corpus
    from ray_app.cli import main

    (tmp_path / "in.csv").write_text("smiles\n" + "\n".join(reconstruct.SMILES) + "\n")
    uris = {kind: f"hf://nvidia/NV-KERMT-70M-v2/pretrain_{kind}_vocab.{'pkl' if kind == 'smiles' else 'json'}"
            for kind in ("atom", "bond", "smiles")}
    flags = [item for kind, uri in uris.items() for item in (f"--{kind}_vocab_path", uri)]
    assert main(["corpus", "--data_path", str(tmp_path / "in.csv"), "--save_dir", str(tmp_path / "c"), *flags]) == 0
    corpus = open_corpus(str(tmp_path / "c"))
    assert corpus.atom_vocab == ContextVocab.load(FIXTURE_DIR / "tiny_atom_vocab.json")
    assert corpus.bond_vocab == ContextVocab.load(FIXTURE_DIR / "tiny_bond_vocab.json")
    assert len(corpus.smiles_vocab) == 41 and corpus.manifest.n_molecules == len(reconstruct.SMILES)
    assert corpus.manifest.settings["vocab_paths"] == uris  # the manifest records what the user named


def test_inspect_takes_a_hub_uri(offline_hub, capsys):
    import json

    from ray_app.cli import main

    assert main(["inspect", "hf://nvidia/NV-KERMT-70M-v2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "hybrid"
    assert main(["inspect", "hf://nvidia"]) == 2
    assert capsys.readouterr().err.startswith("kermt inspect: error: checkpoint hf://nvidia: a Hub URI is")
