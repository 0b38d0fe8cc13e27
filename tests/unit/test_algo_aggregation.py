"""Loss aggregation modes and masked reductions, including empty rows and empty batches."""

from __future__ import annotations

import pytest
import torch

from mindrl.algorithms.aggregation import aggregate_loss, masked_mean, masked_sum
from mindrl.algorithms.names import LOSS_AGG_MODES


def _loop_agg(loss: list[list[float]], mask: list[list[int]], mode: str, horizon=None) -> float:
    """Plain-Python reference; sequences with no valid token are skipped in seq means."""
    if mode == "token-mean":
        vals = [v for row, m in zip(loss, mask) for v, k in zip(row, m) if k]
        return sum(vals) / len(vals) if vals else 0.0
    per_seq = []
    for row, m in zip(loss, mask):
        vals = [v for v, k in zip(row, m) if k]
        if not vals:
            continue
        if mode == "seq-mean-token-mean":
            per_seq.append(sum(vals) / len(vals))
        elif mode == "seq-mean-token-sum":
            per_seq.append(sum(vals))
        else:
            per_seq.append(sum(vals) / (horizon or len(row)))
    return sum(per_seq) / len(per_seq) if per_seq else 0.0


LOSS = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]]
MASK = [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]


def test_hand_values() -> None:
    loss, mask = torch.tensor(LOSS), torch.tensor(MASK)
    # token-mean: (1+2+5+6+7+8)/6; row 2 is empty
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(29 / 6)
    # seq-mean-token-mean: mean(1.5, 6.5)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(4.0)
    # seq-mean-token-sum: mean(3, 26)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(14.5)
    # seq-mean-token-sum-norm with T = 4: mean(3/4, 26/4)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(3.625)
    got = aggregate_loss(loss, mask, "seq-mean-token-sum-norm", horizon=10)
    assert got.item() == pytest.approx(1.45)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_random_against_loop(mode: str) -> None:
    g = torch.Generator().manual_seed(3)
    loss = torch.randn(6, 9, generator=g)
    mask = (torch.rand(6, 9, generator=g) > 0.4).int()
    mask[2] = 0
    got = aggregate_loss(loss, mask, mode)
    assert got.item() == pytest.approx(_loop_agg(loss.tolist(), mask.tolist(), mode), rel=1e-5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_all_masked_is_zero_with_zero_grad(mode: str) -> None:
    loss = torch.randn(3, 4, requires_grad=True)
    out = aggregate_loss(loss, torch.zeros(3, 4), mode)
    assert out.item() == 0.0
    (g,) = torch.autograd.grad(out, loss)
    assert torch.equal(g, torch.zeros(3, 4))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_non_finite_padding_does_not_leak(mode: str) -> None:
    loss = torch.tensor([[1.0, float("nan")], [2.0, float("inf")]])
    mask = torch.tensor([[1, 0], [1, 0]])
    out = aggregate_loss(loss, mask, mode)
    assert torch.isfinite(out)
    assert out.item() == pytest.approx(_loop_agg([[1.0, 0.0], [2.0, 0.0]], mask.tolist(), mode))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_global_normalizer_makes_micro_batches_add_up(mode: str) -> None:
    g = torch.Generator().manual_seed(4)
    loss = torch.randn(8, 5, generator=g)
    mask = (torch.rand(8, 5, generator=g) > 0.3).int()
    mask[5] = 0
    full = aggregate_loss(loss, mask, mode)
    if mode == "token-mean":
        n = float(mask.sum())
    else:
        n = float((mask.sum(-1) > 0).sum())
    parts = [
        aggregate_loss(loss[i : i + 2], mask[i : i + 2], mode, normalizer=n) for i in (0, 2, 4, 6)
    ]
    assert sum(p.item() for p in parts) == pytest.approx(full.item(), rel=1e-5)


def test_gradient_of_token_mean_and_seq_mean() -> None:
    loss = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    (g,) = torch.autograd.grad(aggregate_loss(loss, mask, "token-mean"), loss)
    torch.testing.assert_close(g, torch.tensor([[0.25, 0.25, 0.25], [0.25, 0, 0]]))
    (g,) = torch.autograd.grad(aggregate_loss(loss, mask, "seq-mean-token-mean"), loss)
    torch.testing.assert_close(g, torch.tensor([[1 / 6, 1 / 6, 1 / 6], [0.5, 0, 0]]))


def test_masked_helpers() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    m = torch.tensor([[1, 0], [0, 0]])
    assert masked_sum(x, m).item() == 1.0
    assert masked_mean(x, m, dim=-1).tolist() == [1.0, 0.0]
    assert masked_mean(x, torch.zeros(2, 2)).item() == 0.0


def test_errors() -> None:
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 2), "sum")
    with pytest.raises(ValueError, match="must be"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="normalizer"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 2), normalizer=0.0)
    with pytest.raises(ValueError, match="horizon"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 2), "seq-mean-token-sum-norm", horizon=0)
