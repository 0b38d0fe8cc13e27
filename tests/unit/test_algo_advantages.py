"""Advantage estimators against hand-computed values and plain-Python loop references."""

from __future__ import annotations

import math

import pytest
import torch

from mindrl.algorithms.advantages import (
    compute_advantages,
    group_norm_scores,
    rloo_scores,
    whiten,
)

EPS = 1e-6


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _unbiased_std(xs: list[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _loop_seq_adv(name: str, rewards: list[float], n: int) -> list[float]:
    """Independent per-sample reference (no tensors, float64)."""
    out = []
    for i, r in enumerate(rewards):
        group = rewards[(i // n) * n : (i // n + 1) * n]
        if name == "group_norm":
            out.append((r - _mean(group)) / (_unbiased_std(group) + EPS))
        elif name in ("grpo_no_std", "reinforce_plus_plus_baseline"):
            out.append(r - _mean(group))
        elif name == "rloo":
            others = list(group)
            others.pop(i % n)
            out.append(r - _mean(others))
    return out


def _loop_token_adv(name: str, rewards: list[float], n: int, mask: list[list[int]]):
    seq = _loop_seq_adv(name, rewards, n)
    tok = [[seq[b] if m else 0.0 for m in row] for b, row in enumerate(mask)]
    if name == "reinforce_plus_plus_baseline":
        vals = [tok[b][t] for b, row in enumerate(mask) for t, m in enumerate(row) if m]
        mu = _mean(vals)
        var = sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)
        tok = [
            [(tok[b][t] - mu) / math.sqrt(var + 1e-8) if m else 0.0 for t, m in enumerate(row)]
            for b, row in enumerate(mask)
        ]
    return tok


def _random_case(b: int = 12, t: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(b, generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    return rewards, mask


def test_group_norm_hand_example() -> None:
    # group [1, 0, 1, 0]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    adv = compute_advantages("group_norm", r, 4, mask)
    a = 0.5 / (math.sqrt(1.0 / 3.0) + EPS)
    expected = torch.tensor([[a, a, 0], [-a, 0, 0], [a, a, a], [0, 0, 0]])
    torch.testing.assert_close(adv, expected)
    assert adv.dtype == torch.float32


def test_rloo_hand_example() -> None:
    # group [3, 1, 2]: r_i - mean(others) = 3-1.5, 1-2.5, 2-2
    got = rloo_scores(torch.tensor([3.0, 1.0, 2.0]), 3)
    torch.testing.assert_close(got, torch.tensor([1.5, -1.5, 0.0]))


@pytest.mark.parametrize(
    "name", ["group_norm", "grpo_no_std", "rloo", "reinforce_plus_plus_baseline"]
)
def test_estimators_match_loop_reference(name: str) -> None:
    rewards, mask = _random_case()
    got = compute_advantages(name, rewards, 4, mask)
    ref = _loop_token_adv(name, rewards.tolist(), 4, mask.int().tolist())
    torch.testing.assert_close(got, torch.tensor(ref, dtype=torch.float32), atol=1e-5, rtol=1e-5)


def test_aliases() -> None:
    rewards, mask = _random_case(seed=1)
    for alias, name in [("grpo", "group_norm"), ("dr_grpo", "grpo_no_std")]:
        torch.testing.assert_close(
            compute_advantages(alias, rewards, 4, mask), compute_advantages(name, rewards, 4, mask)
        )


@pytest.mark.parametrize("name", ["group_norm", "grpo_no_std", "rloo"])
@pytest.mark.parametrize("value", [0.7, 0.1, 0.0, 1.0])
def test_tied_group_gives_exact_zero(name: str, value: float) -> None:
    # 8 copies of 0.7 in fp32: the float mean differs from 0.7 by one ulp and the float std is
    # ~1e-8, so (r - mean) / (std + eps) would be ~0.056 without the tie guard.
    rewards = torch.cat([torch.full((8,), value), torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0])])
    mask = torch.ones(16, 5)
    adv = compute_advantages(name, rewards, 8, mask)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[:8], torch.zeros(8, 5))
    assert (adv[8] > 0).all() and (adv[9:] < 0).all()


def test_all_groups_tied_reinforce_pp_is_zero_not_nan() -> None:
    adv = compute_advantages(
        "reinforce_plus_plus_baseline", torch.full((8,), 0.3), 4, torch.ones(8, 3)
    )
    assert torch.equal(adv, torch.zeros(8, 3))


def test_zero_length_response_keeps_its_reward_in_group_stats() -> None:
    # sample 1 has no tokens: its advantage row is 0, but its reward still enters the mean/std
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    mask = torch.tensor([[1, 1], [0, 0], [1, 0], [1, 1]]).float()
    adv = compute_advantages("group_norm", rewards, 4, mask)
    a = 0.5 / (_unbiased_std([1.0, 0.0, 0.0, 1.0]) + EPS)
    torch.testing.assert_close(adv, torch.tensor([[a, a], [0, 0], [-a, 0], [a, a]]))


def test_padding_is_zero_for_every_estimator() -> None:
    rewards, mask = _random_case(seed=2)
    for name in ["group_norm", "grpo_no_std", "rloo", "reinforce_plus_plus_baseline"]:
        adv = compute_advantages(name, rewards, 4, mask)
        assert torch.equal(adv[mask == 0], torch.zeros(int((mask == 0).sum())))


def test_token_level_rewards_are_summed_per_sample() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]).float()
    token_rewards = torch.tensor([[0.0, 1.0, 9.0], [0.5, 0.0, 0.5], [0.2, 9.0, 9.0], [0, 0, 0]])
    seq = torch.tensor([1.0, 1.0, 0.2, 0.0])  # padding (9.0) ignored
    torch.testing.assert_close(
        compute_advantages("rloo", token_rewards, 2, mask), compute_advantages("rloo", seq, 2, mask)
    )


def test_reinforce_pp_whitening_with_one_or_zero_valid_tokens() -> None:
    rewards = torch.tensor([1.0, 0.0])
    one = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert torch.equal(
        compute_advantages("reinforce_plus_plus_baseline", rewards, 2, one), torch.zeros(2, 2)
    )
    none = torch.zeros(2, 2)
    assert torch.equal(
        compute_advantages("reinforce_plus_plus_baseline", rewards, 2, none), torch.zeros(2, 2)
    )


def test_whiten_statistics() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 50.0, 60.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    out = whiten(values, mask)
    vals = [1.0, 2.0, 3.0, 4.0]
    mu, var = 2.5, sum((v - 2.5) ** 2 for v in vals) / 3
    expected = torch.tensor(
        [
            [(v - mu) / math.sqrt(var + 1e-8) for v in (1, 2, 3)],
            [(4 - mu) / math.sqrt(var + 1e-8), 0, 0],
        ]
    )
    torch.testing.assert_close(out, expected)


def test_group_norm_scores_match_torch_std_convention() -> None:
    r = torch.tensor([0.0, 1.0, 1.0, 1.0])
    # unbiased std of [0,1,1,1] = sqrt(0.75 / 3) = 0.5; mean 0.75
    torch.testing.assert_close(
        group_norm_scores(r, 4), torch.tensor([-0.75, 0.25, 0.25, 0.25]) / (0.5 + EPS)
    )


def test_errors() -> None:
    mask = torch.ones(6, 2)
    with pytest.raises(ValueError, match="group_size >= 2"):
        compute_advantages("group_norm", torch.zeros(6), 1, mask)
    with pytest.raises(ValueError, match="groups of 4"):
        compute_advantages("group_norm", torch.zeros(6), 4, mask)
    with pytest.raises(ValueError, match="unknown adv_estimator"):
        compute_advantages("vtrace", torch.zeros(6), 2, mask)
    with pytest.raises(ValueError, match="needs a critic's values"):
        compute_advantages("gae", torch.zeros(6), 2, mask)
    with pytest.raises(ValueError, match="does not match"):
        compute_advantages("rloo", torch.zeros(6), 2, torch.ones(4, 2))
