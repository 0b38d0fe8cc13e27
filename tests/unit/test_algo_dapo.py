"""DAPO dynamic sampling and overlong filtering."""

from __future__ import annotations

import pytest
import torch

from mindrl.algorithms.aggregation import aggregate_loss
from mindrl.algorithms.dapo import (
    GroupFilter,
    group_sample_indices,
    informative_groups,
    overlong_buffer_penalty,
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


def test_filter_keeps_varied_groups_until_the_target_and_trims() -> None:
    batches = [
        _round([1, 0], [1, 1], [0, 0]),  # 1 informative (group 0)
        _round([0, 0], [1, 1], [1, 1]),  # none
        _round([0, 1], [1, 1], [1, 0], [0.5, 0.0]),  # groups 0, 2, 3: only 2 needed
    ]
    filt = GroupFilter(target_groups=3, group_size=2, max_batches=-1)
    kept = []
    for metric in batches:
        kept.append(filt.add(metric).tolist())
    assert kept == [[0, 1], [], [0, 1, 4, 5]]
    assert filt.satisfied and filt.batches == 3 and filt.seen_groups == 10
    assert filt.varied_groups == 4 and filt.kept_groups == 3
    with pytest.raises(RuntimeError):
        filt.add(_round([0, 1]))


def test_filter_is_exhausted_after_max_batches_and_unlimited_at_zero() -> None:
    tied = _round([1, 1], [0, 0])
    filt = GroupFilter(target_groups=2, group_size=2, max_batches=2)
    assert filt.add(tied).tolist() == [] and not filt.exhausted
    assert filt.add(_round([1, 0], [0, 0])).tolist() == [0, 1]
    assert filt.exhausted and not filt.satisfied
    unlimited = GroupFilter(target_groups=1, group_size=2, max_batches=0)
    for _ in range(50):
        unlimited.add(tied)
    assert not unlimited.exhausted and unlimited.batches == 50


def test_groups_of_one_are_always_kept() -> None:
    filt = GroupFilter(target_groups=3, group_size=1)
    assert filt.add(torch.tensor([1.0, 1.0, 1.0, 1.0])).tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        GroupFilter(target_groups=0, group_size=2)


def test_overlong_buffer_penalty_hand_example() -> None:
    # rollout_max_tokens 20, buffer 8, factor 0.5: free up to 12 tokens, -0.5 at 20
    lengths = torch.tensor([5, 12, 13, 16, 20])
    got = overlong_buffer_penalty(lengths, 20, 8, 0.5)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.0625, -0.25, -0.5])
    with pytest.raises(ValueError):
        overlong_buffer_penalty(lengths, 20, 20, 0.5)


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
