"""What a member's coordinator carries and asks for: the run's setup with the source weights shared, not copied."""

from __future__ import annotations

import dataclasses
import pickle

import torch

from tests.conftest import FIXTURE_DIR


def test_a_shared_setup_carries_a_reference_not_the_weights(ray_cluster, tmp_path):
    """What every member coordinator and trial unpickles: the run's setup without inputs. With the checkpoint shared
    it is a few KB whatever the model's size; its tensors are still there for whoever needs them."""
    from kermt.checkpoint import read_checkpoint
    from ray_app.finetune.config import FinetuneConfig
    from ray_app.finetune.run_setup import RunSetup

    checkpoint = read_checkpoint(FIXTURE_DIR / "ckpt_pretrain_vocab.pt")
    setup = RunSetup(FinetuneConfig(data_path="d.csv"), {}, tmp_path, "run", "regression", "rmse", ["t"],
                     checkpoint, None, None, None, str(tmp_path), 0)
    weights = sum(t.numel() * t.element_size() for t in checkpoint.state_dict.values())
    shared = setup.with_shared_checkpoint()
    assert len(pickle.dumps(setup)) > weights > 10 * len(pickle.dumps(shared))
    assert shared.checkpoint.state_dict == {} and shared.with_shared_checkpoint() is shared
    restored = shared.source_checkpoint()
    assert restored.state_dict.keys() == checkpoint.state_dict.keys()
    assert all(torch.equal(restored.state_dict[k], t) for k, t in checkpoint.state_dict.items())
    assert restored.ignored_entries() == checkpoint.ignored_entries()


def test_coordinator_memory_is_its_process_plus_twice_the_model():
    from kermt.checkpoint import read_checkpoint
    from kermt.nn.finetune import KermtFinetuneModel
    from ray_app.finetune.trainable import COORDINATOR_BASE_BYTES, trial_actor_resources, weight_bytes

    config = read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg.pt").spec.finetune_model_config()
    built = KermtFinetuneModel(config)
    expected = sum(t.numel() * t.element_size() for t in [*built.parameters(), *built.buffers()])
    assert weight_bytes(config) == expected > 0
    wider = read_checkpoint(FIXTURE_DIR / "ckpt_ft_reg_ts.pt").spec.finetune_model_config()
    resources = trial_actor_resources(config, wider)
    assert resources["memory"] == COORDINATOR_BASE_BYTES + 2 * max(expected, weight_bytes(wider))
    assert resources["CPU"] == 0


def test_a_model_from_scratch_is_upstream_finetunes_with_the_users_flags(tmp_path):
    """Without a checkpoint the encoder is FROM_SCRATCH (upstream main.py finetune's: ReLU, depth 6, atom branches)
    with what the user set on top."""
    from kermt.presets import FROM_SCRATCH
    from ray_app.finetune.config import FinetuneConfig
    from ray_app.finetune.run_setup import RunSetup, model_config

    def scratch_encoder(**flags):
        setup = RunSetup(FinetuneConfig(data_path="d.csv", **flags), {}, tmp_path, "run", "regression", "rmse",
                         ["t"], None, None, None, None, str(tmp_path), 0)
        return model_config(setup, features_size=0).encoder

    assert scratch_encoder() == FROM_SCRATCH
    assert (FROM_SCRATCH.activation, FROM_SCRATCH.depth, FROM_SCRATCH.embedding_output_type) == ("ReLU", 6, "atom")
    wider = scratch_encoder(hidden_size=1200, depth=3, activation="PReLU", dropout=0.1)
    assert wider == dataclasses.replace(FROM_SCRATCH, hidden_size=1200, depth=3, activation="PReLU", dropout=0.1)
