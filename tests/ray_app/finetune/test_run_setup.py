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
    """Without a checkpoint the encoder is FROM_SCRATCH (upstream main.py finetune's ReLU and atom branches, sized
    for a from-scratch run: issue 38) with what the user set on top."""
    from kermt.presets import FROM_SCRATCH
    from ray_app.finetune.config import FinetuneConfig
    from ray_app.finetune.run_setup import RunSetup, model_config

    def scratch_encoder(**flags):
        setup = RunSetup(FinetuneConfig(data_path="d.csv", **flags), {}, tmp_path, "run", "regression", "rmse",
                         ["t"], None, None, None, None, str(tmp_path), 0)
        return model_config(setup, features_size=0).encoder

    assert scratch_encoder() == FROM_SCRATCH
    assert (FROM_SCRATCH.activation, FROM_SCRATCH.embedding_output_type) == ("ReLU", "atom")
    wider = scratch_encoder(hidden_size=1200, depth=3, activation="PReLU", dropout=0.1)
    assert wider == dataclasses.replace(FROM_SCRATCH, hidden_size=1200, depth=3, activation="PReLU", dropout=0.1)


def _setup_of(tmp_path, targets, **flags):
    """A run's setup over ten featurised molecules (in this process: no cluster) labelled with ``targets``."""
    import numpy as np

    from kermt.data.featurize import featurize_smiles
    from ray_app.finetune.config import FinetuneConfig
    from ray_app.finetune.prepare import SourceData
    from ray_app.finetune.run_setup import RunSetup

    smiles = ["C" * n + "O" for n in range(1, 11)]
    data = SourceData("d.csv", ["a", "b"], np.arange(10), featurize_smiles(smiles), np.asarray(targets, float), ())
    other = SourceData("v.csv", ["a", "b"], np.arange(2), featurize_smiles(smiles[:2]), np.ones((2, 2)), ())
    separate = flags.pop("separate", False)
    return RunSetup(FinetuneConfig(data_path="d.csv", **flags), {}, tmp_path, "run", "regression", "rmse",
                    ["a", "b"], None, data, other if separate else None, other if separate else None, str(tmp_path), 0)


def test_a_task_with_no_label_in_the_train_split_is_refused_before_training(tmp_path):
    """Labels in the file, but the split put every one of task b's in val/test (its head would train on nothing:
    a loss of 0 every epoch); with both separate files the whole training file is the train split."""
    import numpy as np
    import pytest

    from kermt.errors import UserError
    from ray_app.finetune.prepare import split_for_fold
    from ray_app.finetune.run_setup import fold_splits

    labels = np.column_stack([np.arange(10.0), np.full(10, np.nan)])
    setup = _setup_of(tmp_path, labels, seed=3)
    split = split_for_fold(setup.config, setup.data, 0, False, False)
    labels[split.val + split.test, 1] = 1.0  # task b labelled on the rows that are not train
    with pytest.raises(UserError, match=r"^fold 0: task 'b' has no label in the train split: the 2 molecule\(s\) of "
                       r"d.csv labelled for it all went to val/test \(--split_type random, --seed 3\); label more, "
                       r"change --split_sizes or --seed, or train on the other tasks with --target_columns$"):
        fold_splits(_setup_of(tmp_path, labels, seed=3), 0)
    labels[split.train[0], 1] = 2.0  # one train label is enough
    assert len(fold_splits(_setup_of(tmp_path, labels, seed=3), 0)[1].train) == 8
    with pytest.raises(UserError, match=r"^fold 0: the train split is empty"):  # that error, not this one
        fold_splits(_setup_of(tmp_path, labels, seed=3, split_sizes=(0.0, 0.5, 0.5)), 0)
    labels[:, 1] = np.nan  # e.g. its only labelled rows had invalid SMILES
    with pytest.raises(UserError, match=r"^d.csv: task 'b' has no label in the train split, which is the whole file "
                       r"\(--separate_val_path and --separate_test_path hold val and test\): none of the file's "
                       r"valid molecules is labelled for it"):
        fold_splits(_setup_of(tmp_path, labels, separate=True), 0)
