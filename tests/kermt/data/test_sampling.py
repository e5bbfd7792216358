from __future__ import annotations

import numpy as np

from kermt.data.sampling import epoch_order, global_batches, worker_share


def epoch_plan(num_molecules: int, batch_size: int, world_size: int, rank: int, seed: int, epoch: int) -> list:
    """This worker's rows for every step of an epoch (``batch_size`` per worker), as the train loops take them."""
    batches = global_batches(epoch_order(num_molecules, seed, epoch), batch_size * world_size)
    return [worker_share(batch, rank, world_size) for batch in batches]


def test_every_molecule_once_per_epoch_on_any_cluster_size():
    for world in (1, 2, 3, 4):
        plans = [epoch_plan(103, 8, world, rank, seed=5, epoch=2) for rank in range(world)]
        assert len({len(p) for p in plans}) == 1  # same number of steps on every rank
        used = np.concatenate([rows for plan in plans for rows in plan])
        assert sorted(used.tolist()) == list(range(103))


def test_global_batch_holds_the_same_molecules_whatever_the_worker_count():
    single = epoch_plan(50, 8, 1, 0, seed=1, epoch=0)
    pair = [epoch_plan(50, 4, 2, r, seed=1, epoch=0) for r in (0, 1)]
    for step, rows in enumerate(single):
        assert np.array_equal(rows, np.concatenate([pair[0][step], pair[1][step]]))


def test_order_is_seeded_and_changes_per_epoch():
    assert np.array_equal(epoch_order(20, 0, 0), epoch_order(20, 0, 0))
    assert not np.array_equal(epoch_order(20, 0, 0), epoch_order(20, 0, 1))
    assert not np.array_equal(epoch_order(20, 0, 0), epoch_order(20, 1, 0))
    assert epoch_order(5, 0, 0, shuffle=False).tolist() == [0, 1, 2, 3, 4]
