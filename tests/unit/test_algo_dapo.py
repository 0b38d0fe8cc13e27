"""DAPO dynamic sampling and overlong filtering."""

from __future__ import annotations

import pytest
import torch

from mindrl.algorithms.aggregation import aggregate_loss
from mindrl.algorithms.dapo import (
    DynamicSampler,
    accumulate_groups,
    group_sample_indices,
    informative_groups,
    overlong_filter,
    truncated_responses,
)


def test_informative_groups_hand_example() -> None:
    scores = torch.tensor([1, 1, 1, 0, 1, 0, 0, 0, 0, 0.5, 0.5, 0.2])
    assert informative_groups(scores, 3).tolist() == [1, 3]
    assert informative_groups(torch.full((6,), 0.7), 3).tolist() == []
    assert group_sample_indices(torch.tensor([1, 3]), 3).tolist() == [3, 4, 5, 9, 10, 11]
    with pytest.raises(ValueError):
        informative_groups(torch.zeros(5), 2)


def test_informative_groups_against_loop() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 2, (40,), generator=g).float()
    expected = [i for i in range(10) if len(set(scores[i * 4 : i * 4 + 4].tolist())) > 1]
    assert informative_groups(scores, 4).tolist() == expected


def _round(*groups: list[float]) -> torch.Tensor:
    return torch.tensor([s for grp in groups for s in grp])


def test_accumulate_until_target_and_trim() -> None:
    pulled = []

    def rounds():
        data = [
            _round([1, 0], [1, 1], [0, 0]),  # 1 informative (group 0)
            _round([0, 0], [1, 1], [1, 1]),  # none
            _round([0, 1], [1, 1], [1, 0], [0.5, 0.0]),  # groups 0, 2, 3: only 2 needed
            _round([0, 1], [1, 0], [1, 0]),  # must never be pulled
        ]
        for i, scores in enumerate(data):
            pulled.append(i)
            yield scores

    res = accumulate_groups(rounds(), group_size=2, target_groups=3, max_resample_times=5)
    assert res.rounds_used == 3 and res.num_groups == 3 and res.satisfied
    assert [k.tolist() for k in res.kept] == [[0, 1], [], [0, 1, 4, 5]]
    assert pulled == [0, 1, 2]


def test_accumulate_stops_after_max_resample_times() -> None:
    tied = _round([1, 1], [0, 0])
    res = accumulate_groups(
        iter([tied, _round([1, 0], [0, 0]), tied, tied]), 2, target_groups=4, max_resample_times=1
    )
    assert res.rounds_used == 2 and res.num_groups == 1 and not res.satisfied
    assert [k.tolist() for k in res.kept] == [[], [0, 1]]


def test_sampler_state_and_misuse() -> None:
    sampler = DynamicSampler(target_groups=1, group_size=2, max_resample_times=0)
    assert not sampler.done
    assert sampler.add(_round([1, 1], [0, 1])).tolist() == [2, 3]
    assert sampler.done and sampler.satisfied and sampler.rounds == 1 and sampler.seen_groups == 2
    with pytest.raises(RuntimeError):
        sampler.add(_round([1, 0]))
    with pytest.raises(ValueError):
        DynamicSampler(target_groups=0, group_size=2)


def test_overlong_filter_from_finish_reasons_and_bool() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    reasons = ["stop", "length", "abort"]
    assert truncated_responses(reasons).tolist() == [False, True, False]
    expected = [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert overlong_filter(mask, reasons).tolist() == expected
    assert overlong_filter(mask.float(), torch.tensor([False, True, False])).tolist() == expected
    assert overlong_filter(mask.bool(), reasons).dtype == torch.bool
    with pytest.raises(ValueError):
        overlong_filter(mask, ["stop"])


def test_overlong_rows_drop_out_of_seq_mean_loss() -> None:
    loss = torch.tensor([[1.0, 1.0], [100.0, 100.0], [3.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    filtered = overlong_filter(mask, ["stop", "length", "stop"])
    # mean over the two kept sequences of their token means: (1 + 3) / 2
    assert aggregate_loss(loss, filtered, "seq-mean-token-mean").item() == pytest.approx(2.0)
