"""ResumableSampler: deterministic order, and stop/restart reproduces the uninterrupted run."""

from __future__ import annotations

import json

import pytest

from mindrl.data.sampler import ResumableSampler


def _take(sampler: ResumableSampler, n: int) -> list[list[int]]:
    return [sampler.next_batch() for _ in range(n)]


def _batches_per_epoch(num_samples: int, batch_size: int, drop_last: bool) -> int:
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


CASES = [
    # (num_samples, batch_size, shuffle, drop_last)
    (10, 3, True, True),
    (10, 3, False, True),
    (10, 3, True, False),
    (10, 3, False, False),
    (12, 4, True, True),  # divides evenly: the boundary is a plain batch boundary
    (7, 7, True, True),  # one batch per epoch: every stop is at an epoch boundary
]


@pytest.mark.parametrize(("n", "b", "shuffle", "drop_last"), CASES)
def test_restart_anywhere_reproduces_the_uninterrupted_sequence(n, b, shuffle, drop_last):
    per_epoch = _batches_per_epoch(n, b, drop_last)
    total = 4 * per_epoch  # four epochs
    reference = _take(ResumableSampler(n, b, seed=7, shuffle=shuffle, drop_last=drop_last), total)
    assert len(reference) == total
    for stop in range(total + 1):  # every batch boundary, epoch boundaries included
        first = ResumableSampler(n, b, seed=7, shuffle=shuffle, drop_last=drop_last)
        head = _take(first, stop)
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
        if stop % per_epoch == 0:
            assert state == {"epoch": stop // per_epoch, "position": 0}
        second = ResumableSampler(n, b, seed=7, shuffle=shuffle, drop_last=drop_last)
        second.load_state_dict(state)
        assert head + _take(second, total - stop) == reference, f"restart after {stop} batches"
        # two restarts: stop, resume, run half of the rest, stop again, resume
        middle_len = (total - stop) // 2
        resumed = ResumableSampler(n, b, seed=7, shuffle=shuffle, drop_last=drop_last)
        resumed.load_state_dict(state)
        middle = _take(resumed, middle_len)
        third = ResumableSampler(n, b, seed=7, shuffle=shuffle, drop_last=drop_last)
        third.load_state_dict(resumed.state_dict())
        tail = _take(third, total - stop - middle_len)
        assert head + middle + tail == reference


@pytest.mark.parametrize(("n", "b", "shuffle", "drop_last"), CASES)
def test_epochs_are_permutations_cut_into_batches(n, b, shuffle, drop_last):
    sampler = ResumableSampler(n, b, seed=3, shuffle=shuffle, drop_last=drop_last)
    per_epoch = _batches_per_epoch(n, b, drop_last)
    assert len(sampler) == per_epoch
    usable = n - n % b if drop_last else n
    for epoch in range(3):
        batches = list(sampler)  # __iter__ = the rest of the current epoch
        assert len(batches) == per_epoch
        flat = [i for batch in batches for i in batch]
        assert len(flat) == usable and len(set(flat)) == usable and set(flat) <= set(range(n))
        sizes = [len(batch) for batch in batches]
        assert sizes == [b] * (usable // b) + ([usable % b] if usable % b else [])
        if not shuffle:
            assert flat == list(range(usable))
        assert sampler.state_dict() == {"epoch": epoch + 1, "position": 0}


def test_shuffle_is_deterministic_per_seed_and_changes_per_epoch():
    a = _take(ResumableSampler(50, 10, seed=1), 10)
    b = _take(ResumableSampler(50, 10, seed=1), 10)
    c = _take(ResumableSampler(50, 10, seed=2), 10)
    assert a == b
    assert a != c
    epoch0 = [i for batch in a[:5] for i in batch]
    epoch1 = [i for batch in a[5:] for i in batch]
    assert sorted(epoch0) == sorted(epoch1) == list(range(50))
    assert epoch0 != epoch1 and epoch0 != list(range(50))


def test_mid_epoch_state_counts_consumed_indices():
    sampler = ResumableSampler(10, 3, seed=0)
    _take(sampler, 2)
    assert sampler.state_dict() == {"epoch": 0, "position": 6}
    _take(sampler, 1)  # the third batch ends epoch 0 (the last index is dropped)
    assert sampler.state_dict() == {"epoch": 1, "position": 0}


def test_loading_a_position_in_the_dropped_tail_moves_to_the_next_epoch():
    reference = ResumableSampler(10, 3, seed=5)
    expected = _take(reference, 6)[3:]  # epoch 1
    sampler = ResumableSampler(10, 3, seed=5)
    sampler.load_state_dict({"epoch": 0, "position": 10})
    assert sampler.state_dict() == {"epoch": 1, "position": 0}
    assert _take(sampler, 3) == expected


@pytest.mark.parametrize(
    ("kwargs", "state"),
    [({}, {"epoch": -1, "position": 0}), ({}, {"epoch": 0, "position": 11})],
)
def test_invalid_state(kwargs, state):
    with pytest.raises(ValueError):
        ResumableSampler(10, 3, **kwargs).load_state_dict(state)


def test_invalid_sizes():
    with pytest.raises(ValueError):
        ResumableSampler(0, 1)
    with pytest.raises(ValueError):
        ResumableSampler(4, 0)
    with pytest.raises(ValueError, match="no batch"):
        ResumableSampler(4, 5, drop_last=True)
    assert _take(ResumableSampler(4, 5, drop_last=False, shuffle=False), 2) == [
        [0, 1, 2, 3],
        [0, 1, 2, 3],
    ]
