"""The RL task stream (grain): per-epoch shuffles, no task twice in a step, disjoint shards."""

import collections

import numpy as np
import pytest

from orchestrax.data.tasks import task_stream


@pytest.mark.parametrize("num_tasks, per_step", [(10, 4), (13, 5), (8, 8), (7, 1)])
def test_no_task_twice_in_a_step_across_epoch_boundaries(num_tasks, per_step):
    ds = task_stream(num_tasks, per_step, seed=3)
    steps_per_epoch = num_tasks // per_step
    steps = [ds[i] for i in range(6 * steps_per_epoch)]
    for ids in steps:
        assert ids.shape == (per_step,) and len(set(ids.tolist())) == per_step
        assert 0 <= ids.min() and ids.max() < num_tasks
    # Each epoch's steps are disjoint slices of one permutation: no task twice within an epoch.
    epochs = [np.concatenate(steps[e * steps_per_epoch:(e + 1) * steps_per_epoch])
              for e in range(6)]
    for ids in epochs:
        assert len(set(ids.tolist())) == len(ids) == steps_per_epoch * per_step
    if num_tasks > 1 and per_step < num_tasks:  # reshuffled per epoch
        assert len({tuple(ids.tolist()) for ids in epochs}) > 1


def test_remainder_differs_per_epoch_so_every_task_is_seen():
    ds = task_stream(10, 4, seed=0)  # 2 steps per epoch, 2 tasks left out each epoch
    seen = collections.Counter(int(i) for s in range(40) for i in ds[s])
    assert sorted(seen) == list(range(10))
    assert max(seen.values()) - min(seen.values()) <= 8  # roughly even over 20 epochs


def test_same_seed_same_order_other_seed_other_order():
    a, b, c = (task_stream(20, 4, seed=s) for s in (1, 1, 2))
    assert all((a[i] == b[i]).all() for i in range(10))
    assert any((a[i] != c[i]).any() for i in range(10))


@pytest.mark.parametrize("num_tasks", [10, 11])
def test_two_processes_get_disjoint_shards_that_cover_the_dataset(num_tasks):
    shards = [task_stream(num_tasks, 4, seed=5, process_index=p, process_count=2)
              for p in (0, 1)]
    per_epoch = [set(), set()]
    for p, ds in enumerate(shards):
        steps_per_epoch = len(range(p, num_tasks, 2)) // 2
        for s in range(40 * steps_per_epoch):
            ids = ds[s].tolist()
            assert len(ids) == 2 and len(set(ids)) == 2  # 4 per step over 2 processes
            per_epoch[p] |= set(ids)
    assert per_epoch[0].isdisjoint(per_epoch[1])
    assert per_epoch[0] | per_epoch[1] == set(range(num_tasks))
    assert per_epoch[0] == set(range(0, num_tasks, 2))


def test_bad_shapes_name_the_field():
    with pytest.raises(ValueError, match="tasks_per_step=5 does not split evenly over 2"):
        task_stream(10, 5, seed=0, process_index=0, process_count=2)
    with pytest.raises(ValueError, match="tasks_per_step=12: 12 per process, but process 0's "
                                         "shard has 10"):
        task_stream(10, 12, seed=0)
    with pytest.raises(ValueError, match="process_index=2, process_count=2"):
        task_stream(10, 2, seed=0, process_index=2, process_count=2)
