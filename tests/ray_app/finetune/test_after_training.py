"""The step after training reads the fold's shards, not the fold's object: on a finished run's fold, cut again and
written as shards (several a split), the task's score, member scores, test predictions and domain threshold equal
what the fold's object gives when computed here, as the driver computed them before, and its test predictions are
bit for bit those of each member predicting the shards alone, one member after the other (the task reads each shard
once and predicts it with every member: ray_app.finetune.after_training)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import ray

from kermt.data.molecule_shards import write_split
from kermt.inference.columns import DISTANCE_COLUMN, ensemble_mean
from kermt.metrics import task_scores
from kermt.train.step import score
from kermt.uncertainty.conformal import MONDRIAN_DOMAIN
from kermt.uncertainty.domain import DomainSearch, embedding_identity, fit_domain, load_domain, training_rows
from ray_app.common import outputs
from ray_app.finetune.after_training import MEMBER_WEIGHTS_IN_MEMORY, _member_groups, finish_fold, finish_folds, \
    run_width_rule
from ray_app.finetune.config import resolve
from ray_app.finetune.domain import _featurized, split_embeddings
from ray_app.finetune.calibrate import calibrate_fold, validation_set
from ray_app.finetune.fold_data import SplitShards, write_folds
from ray_app.finetune.members import member_test_predictions, predict_molecules
from ray_app.finetune.resume import finished_member
from ray_app.finetune.run import put_folds
from ray_app.finetune.run_setup import resolve_setup
from ray_app.report.results import read_test_result
from tests.conftest import FIXTURE_DIR

# In the default suite: each takes about a second on the session's regression_run (tests/ray_app/conftest.py),
# which the report tests make anyway.


def _refolded(regression_run, tmp_path):
    """(the run's copy, its config and setup, each fold's object and model config, each fold's shards: 16 molecules
    a shard, so train 3, val 3 and test 2 shards)."""
    run = shutil.copytree(regression_run[0], tmp_path / "run", ignore=shutil.ignore_patterns("ray_results"))
    config, sources = resolve([  # regression_run's command (tests/ray_app/conftest.py), into the copy
        "--data_path", str(regression_run[0].parent / "data.csv"), "--checkpoint_path",
        str(FIXTURE_DIR / "ckpt_pretrain_vocab.pt"), "--save_dir", str(run), "--epochs", "1", "--batch_size", "16",
        "--ffn_hidden_size", "8", "--ensemble_size", "2", "--split_sizes", "0.4", "0.4", "0.2"])
    setup = resolve_setup(config, sources)
    refs, configs, _, _ = put_folds(setup)
    setup = replace(setup, run_id=json.loads((run / "run.json").read_text())["summary"]["run_id"]).without_inputs()
    data = write_folds(str(tmp_path / "storage"), setup.run_id, refs, shard_rows=16)
    assert data[0].test is not None and sum(data[0].test.manifest.rows) == len(data[0].test_targets_raw)
    assert [len(s.manifest.files) for s in (data[0].train, data[0].val, data[0].test)] == [3, 3, 2]
    return run, config, setup, refs, configs, data


def test_the_fold_task_reads_shards_and_equals_the_computation_on_the_folds_object(regression_run, tmp_path,
                                                                                     capsys):
    run, config, setup, refs, configs, data = _refolded(regression_run, tmp_path)
    capsys.readouterr()
    scores, calibrations, folds = finish_folds(setup, configs, data)
    printed = capsys.readouterr().out
    assert "fold 0: applicability domain" in printed and "fold 0: calibrated" in printed
    assert folds == json.loads((regression_run[0] / "run.json").read_text())["folds"]  # the run's own record

    splits, rule = ray.get(refs[0]), run_width_rule(setup, 1)  # the fold's object, as the driver read it before
    models = [finished_member(setup.layout.member(0, m), setup.run_id, configs[0])[0] for m in range(2)]
    preds = [member_test_predictions(m, splits, config.step_batch_size, rule=rule) for m in models]
    assert scores[0] == score(ensemble_mean(preds), splits.test_targets_raw, setup.metric, setup.dataset_type,
                              None)[0]
    assert folds["fold_0"]["member_test_scores"] == [
        dict(zip(setup.task_names, task_scores(p, splits.test_targets_raw, setup.metric, setup.dataset_type)))
        for p in preds]
    written = run / "fold_0" / "test_result.csv"
    np.testing.assert_allclose(read_test_result(written).preds, ensemble_mean(preds), rtol=1e-5)
    alone = [np.concatenate([predict_molecules(m, part, splits.target_scaler, config.step_batch_size, rule=rule)[0]
                             for part in data[0].test.sets()]) for m in models]  # a member at a time
    assert written.read_text() == outputs.test_result_csv(splits.test.smiles, setup.task_names, ensemble_mean(alone),
                                                          splits.test_targets_raw)
    train, val = (split_embeddings(models[0], _featurized(part), config.step_batch_size, False, rule)
                  for part in (splits.train.take(training_rows(len(splits.train))), splits.val))
    here = fit_domain(train, val, embedding_identity(models[0].state_dict()), n_training_total=len(splits.train))
    assert load_domain(str(run / "fold_0")).threshold == pytest.approx(here.threshold, rel=1e-6)
    assert calibrations == json.loads((regression_run[0] / "run.json").read_text())["calibration"]


def test_a_mondrian_domain_fold_gets_its_distances_in_the_reads_that_predict_and_a_tiny_val_split_no_domain(
        regression_run, tmp_path, capsys):
    """With --calibration_method mondrian_domain the validation and test shards are embedded in the read that gives
    the members' predictions (each shard read once): the test molecules' distances (test_spread.csv) and the
    calibration equal what the whole splits give; a validation split too small for a domain leaves the fold without
    one (and its mondrian_domain calibration without distances), in one line each, not a failed run."""
    run, config, setup, refs, configs, data = _refolded(regression_run, tmp_path)
    setup = replace(setup, config=setup.config.model_copy(update={"calibration_method": MONDRIAN_DOMAIN}))
    splits, rule = ray.get(refs[0]), run_width_rule(setup, 1)
    capsys.readouterr()
    outcome = finish_fold(setup, 0, configs[0], data[0], rule=rule)
    assert "fold 0: applicability domain" in capsys.readouterr().out
    models = [finished_member(setup.layout.member(0, m), setup.run_id, configs[0])[0] for m in range(2)]
    search = DomainSearch(load_domain(str(run / "fold_0")))
    test, val = (search.distances(split_embeddings(models[0], _featurized(part), config.step_batch_size, False, rule))
                 for part in (splits.test, splits.val))
    spread = pd.read_csv(run / "fold_0" / "test_spread.csv", index_col=0)
    np.testing.assert_allclose(spread[DISTANCE_COLUMN].to_numpy(), test, rtol=1e-6)
    cal = [predict_molecules(m, splits.val, splits.target_scaler, config.step_batch_size, rule=rule)[0]
           for m in models]
    whole = calibrate_fold(setup, 0, validation_set(0, splits), cal, None, val)  # rewrites calibration.json
    assert outcome.calibration["method"] == whole["method"] == MONDRIAN_DOMAIN
    for task, fitted in whole["tasks"].items():
        assert outcome.calibration["tasks"][task] == pytest.approx(fitted, rel=1e-5)

    tiny = str(tmp_path / "tiny_val")  # 5 validation molecules, in 3 shards
    few = replace(data[0], val=SplitShards(tiny, write_split(tiny, splits.val.take(np.arange(5)), 2)))
    outcome = finish_fold(setup, 0, configs[0], few, rule=rule)
    printed = capsys.readouterr().out
    assert "fold 0: no applicability domain (48 training and 5 validation molecule(s): a domain needs" in printed
    assert outcome.calibration["file"] is None and f"fold 0: no calibration ({outcome.calibration['reason']})" \
        in printed
    assert DISTANCE_COLUMN not in pd.read_csv(run / "fold_0" / "test_spread.csv", index_col=0).columns


def test_members_loaded_a_group_at_a_time_give_the_same_fold(regression_run, tmp_path, capsys):
    """A weights budget that holds one member at a time (two groups, each reading the shards): the same score,
    calibration, record and fold files as both members at once, under a mondrian_domain calibration (the first
    group also measures the distances)."""
    run, config, setup, refs, configs, data = _refolded(regression_run, tmp_path)
    setup = replace(setup, config=setup.config.model_copy(update={"calibration_method": MONDRIAN_DOMAIN}))
    rule = run_width_rule(setup, 1)
    assert _member_groups(setup, 0, configs[0], MEMBER_WEIGHTS_IN_MEMORY) == [[0, 1]]
    assert _member_groups(setup, 0, configs[0], 1) == [[0], [1]]
    together = finish_fold(setup, 0, configs[0], data[0], rule=rule)
    written = _fold_files(run)
    apart = finish_fold(setup, 0, configs[0], data[0], rule=rule, weights_in_memory=1)
    assert (apart.score, apart.calibration, apart.record) == (together.score, together.calibration, together.record)
    assert _fold_files(run) == written and len(written) >= 4  # test result and spread, calibration, domain
    assert capsys.readouterr().out.count("fold 0: applicability domain") == 2  # once a run: the first group's


def _fold_files(run) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (run / "fold_0").iterdir() if p.is_file()}
