"""A fold's shards written by a Ray task from the fold's object (what `kermt finetune` does, so that its driver never
reads a fold back to write it) are the shards the driver would have written from the same splits: the same
manifests, molecules and training degrees."""

from __future__ import annotations

import numpy as np
import pytest
import ray

from ray_app.finetune.fold_data import write_fold_data, write_folds
from ray_app.finetune.prepare import ScaledSplits
from tests.kermt.data.test_molecule_shards import _same_molecules
from tests.kermt.train.member_plans import member_plan


# Runs with -m slow: every finetune test writes its folds this way (test_finetune.py compares the results with
# upstream's); this one checks the shards themselves, at ~35 s on a loaded 2-core machine
@pytest.mark.slow
def test_folds_written_by_tasks_equal_the_folds_written_here(ray_cluster, tmp_path):
    plan = member_plan(8, "zero")
    shorter = plan.train.take(np.arange(40))  # a second fold: another split of the same molecules
    splits = [ScaledSplits(train, plan.val, plan.val, plan.val.targets, plan.target_scaler, None)
              for train in (plan.train, shorter)]
    storage = str(tmp_path)
    by_tasks = write_folds(storage, "tasks", [ray.put(s) for s in splits])
    for fold, (split, written) in enumerate(zip(splits, by_tasks)):
        here = write_fold_data(storage, "here", fold, split.train, split.val)
        assert written.train.directory == f"{storage}/tasks-data/fold_{fold}/train"
        assert written.train.manifest == here.train.manifest and written.val.manifest == here.val.manifest
        assert written.train.manifest.rows == (len(split.train),) and written.train.node is None
        np.testing.assert_array_equal(written.train_degrees, here.train_degrees)
        _same_molecules(written.train.load()(0), split.train)
        _same_molecules(written.val.load()(0), split.val)
