"""Entropy / log-probs from logits, truncated importance sampling and mismatch metrics."""

from __future__ import annotations

import math

import pytest
import torch

from mindrl.algorithms.logprobs import entropy_from_logits, log_probs_from_logits
from mindrl.algorithms.tis import rollout_mismatch_metrics, tis_weights


def _loop_entropy(row: list[float]) -> float:
    m = max(row)
    exps = [math.exp(z - m) for z in row]
    total = sum(exps)
    return -sum((e / total) * math.log(e / total) for e in exps if e > 0)


def test_entropy_matches_loop_and_limits() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g) * 3
    got = entropy_from_logits(logits)
    expected = torch.tensor([[_loop_entropy(v) for v in row] for row in logits.tolist()])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert entropy_from_logits(torch.zeros(1, 8)).item() == pytest.approx(math.log(8))
    assert entropy_from_logits(torch.tensor([[100.0, 0.0, 0.0]])).item() == pytest.approx(
        0, abs=1e-6
    )
    assert entropy_from_logits(logits.bfloat16()).dtype == torch.float32


def test_log_probs_from_logits() -> None:
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]])
    labels = torch.tensor([[2, 1]])
    lse = math.log(math.exp(1) + math.exp(2) + math.exp(3))
    expected = torch.tensor([[3.0 - lse, -math.log(3)]])
    torch.testing.assert_close(log_probs_from_logits(logits, labels), expected)


def test_tis_weights_hand_values_and_cap() -> None:
    old = torch.tensor([[math.log(1.5), math.log(3.0), -1.0, 0.0]])
    rollout = torch.tensor([[0.0, 0.0, 0.0, float("-inf")]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = tis_weights(old, rollout, mask)  # default cap 2.0
    torch.testing.assert_close(w, torch.tensor([[1.5, 2.0, math.exp(-1.0), 1.0]]))
    w = tis_weights(old, rollout, mask, cap=1.2)
    torch.testing.assert_close(w, torch.tensor([[1.2, 1.2, math.exp(-1.0), 1.0]]))
    exact = tis_weights(torch.tensor([[math.log(2.0)]]), torch.zeros(1, 1), torch.ones(1, 1))
    assert exact.item() == pytest.approx(2.0)
    with pytest.raises(ValueError):
        tis_weights(old, rollout, mask, cap=0.0)


def test_tis_weights_carry_no_gradient() -> None:
    old = torch.zeros(1, 2, requires_grad=True)
    w = tis_weights(old, torch.zeros(1, 2), torch.ones(1, 2))
    assert not w.requires_grad


def test_mismatch_metrics_against_loop() -> None:
    g = torch.Generator().manual_seed(1)
    train = -torch.rand(3, 6, generator=g) * 3
    rollout = train + torch.randn(3, 6, generator=g) * 0.1
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0], [0] * 6])
    rollout[1, 4] = float("-inf")  # padding may hold anything
    diffs = [
        t - r
        for trow, rrow, mrow in zip(train.tolist(), rollout.tolist(), mask.tolist())
        for t, r, k in zip(trow, rrow, mrow)
        if k
    ]
    got = rollout_mismatch_metrics(train, rollout, mask)
    assert got["rollout/logprob_abs_diff"] == pytest.approx(sum(map(abs, diffs)) / 9, rel=1e-5)
    assert got["rollout/logprob_abs_diff_max"] == pytest.approx(max(map(abs, diffs)), rel=1e-5)
    k3 = sum(math.exp(d) - 1 - d for d in diffs) / 9
    assert got["rollout/k3_kl"] == pytest.approx(k3, rel=1e-4)


def test_mismatch_metrics_identical_and_empty() -> None:
    x = torch.randn(2, 3)
    same = rollout_mismatch_metrics(x, x.clone(), torch.ones(2, 3))
    assert same == {
        "rollout/logprob_abs_diff": 0.0,
        "rollout/logprob_abs_diff_max": 0.0,
        "rollout/k3_kl": 0.0,
    }
    empty = rollout_mismatch_metrics(x, x + 1, torch.zeros(2, 3))
    assert all(v == 0.0 for v in empty.values())
