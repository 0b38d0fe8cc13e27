"""PPO clip / clip-higher / dual-clip loss: values, metrics, boundaries and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from mindrl.algorithms.policy_loss import compute_policy_loss, ppo_clip_token_losses


def _ref_token_loss(a: float, r: float, lo: float, hi: float, c: float | None) -> float:
    """verl's formulation: max(-A r, -A clip(r)); for A < 0 also min with -A c."""
    clipped_r = min(max(r, 1 - lo), 1 + hi)
    loss = max(-a * r, -a * clipped_r)
    if c is not None and a < 0:
        loss = min(loss, -a * c)
    return loss


def _tokens(ratios: list[float], advs: list[float]):
    log_prob = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
    old = torch.zeros(1, len(ratios))
    adv = torch.tensor([advs])
    return log_prob, old, adv


RATIOS = [0.5, 0.9, 1.0, 1.1, 1.25, 1.5, 2.5, 4.0, 0.5, 0.7, 1.0, 1.5, 2.5, 4.0, 1.7]
ADVS = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -2.0, -1.0, -1.0, -0.5, -1.0, 0.0]


@pytest.mark.parametrize("high", [None, 0.28])
@pytest.mark.parametrize("c", [3.0, None])
def test_token_losses_match_reference(high: float | None, c: float | None) -> None:
    log_prob, old, adv = _tokens(RATIOS, ADVS)
    out = ppo_clip_token_losses(log_prob, old, adv, 0.2, high, c)
    hi = 0.2 if high is None else high
    expected = [_ref_token_loss(a, r, 0.2, hi, c) for a, r in zip(ADVS, RATIOS)]
    torch.testing.assert_close(out.losses[0], torch.tensor(expected), rtol=1e-6, atol=1e-6)


def test_metrics_hand_example() -> None:
    # eps 0.2, c 3: tokens
    #  A=+1 r=1.5 -> clipped high; A=+1 r=0.5 -> unclipped; A=-1 r=0.5 -> clipped low;
    #  A=-1 r=4 -> dual clip; A=-1 r=1.1 -> none; padded token (huge ratio) ignored
    ratios = [1.5, 0.5, 0.5, 4.0, 1.1, 50.0]
    advs = [1.0, 1.0, -1.0, -1.0, -1.0, 1.0]
    log_prob, old, adv = _tokens(ratios, advs)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    out = compute_policy_loss(log_prob, old, adv, mask, 0.2, None, 3.0)
    expected_tokens = [-1.2, -0.5, 0.8, 3.0, 1.1]
    assert out.loss.item() == pytest.approx(sum(expected_tokens) / 5, rel=1e-6)
    assert out.pg_clipfrac == pytest.approx(2 / 5)
    assert out.pg_clipfrac_lower == pytest.approx(1 / 5)
    # ppo_kl = mean(old - new) = -mean(log r) over valid tokens
    assert out.ppo_kl == pytest.approx(-sum(math.log(r) for r in ratios[:5]) / 5, rel=1e-5)


def test_clip_higher_widens_only_the_upper_bound() -> None:
    log_prob, old, adv = _tokens([1.25, 0.75], [1.0, -1.0])
    sym = ppo_clip_token_losses(log_prob, old, adv, 0.2, None)
    asym = ppo_clip_token_losses(log_prob, old, adv, 0.2, 0.28)
    assert sym.clipped.tolist() == [[True, True]]
    assert asym.clipped.tolist() == [[False, True]]
    assert asym.losses[0, 0].item() == pytest.approx(-1.25, rel=1e-6)
    assert asym.losses[0, 1].item() == pytest.approx(0.8, rel=1e-6)


def _exact_ratio_case(log_ratio: float):
    """A ratio r = exp(x) computed in fp32 exactly as the loss does, and its float value."""
    log_prob = torch.tensor([[log_ratio]], requires_grad=True)
    r = float(torch.exp(torch.tensor(log_ratio, dtype=torch.float32)))
    return log_prob, torch.zeros(1, 1), r


def _grad(losses: torch.Tensor, log_prob: torch.Tensor) -> float:
    (g,) = torch.autograd.grad(losses.sum(), log_prob)
    return g.item()


def test_upper_bound_exactly_hit_is_unclipped_with_full_gradient() -> None:
    log_prob, old, r = _exact_ratio_case(0.18)
    adv = torch.tensor([[2.0]])
    out = ppo_clip_token_losses(log_prob, old, adv, 0.2, r - 1.0)  # 1 + eps_high == r exactly
    assert not out.clipped.item()
    assert out.losses.item() == pytest.approx(-2.0 * r)
    assert _grad(out.losses, log_prob) == pytest.approx(-2.0 * r)  # d(-A e^x)/dx
    # one step past the bound: clipped, zero gradient
    past = ppo_clip_token_losses(log_prob, old, adv, 0.2, r - 1.0 - 1e-4)
    assert past.clipped.item()
    assert _grad(past.losses, log_prob) == 0.0


def test_lower_bound_exactly_hit_is_unclipped_with_full_gradient() -> None:
    log_prob, old, r = _exact_ratio_case(-0.2)
    adv = torch.tensor([[-1.5]])
    out = ppo_clip_token_losses(log_prob, old, adv, 1.0 - r)  # 1 - eps_low == r exactly
    assert not out.clipped.item()
    assert _grad(out.losses, log_prob) == pytest.approx(1.5 * r)
    past = ppo_clip_token_losses(log_prob, old, adv, 1.0 - r - 1e-4)
    assert past.clipped.item()
    assert past.losses.item() == pytest.approx(1.5 * (r + 1e-4), rel=1e-6)
    assert _grad(past.losses, log_prob) == 0.0


def test_dual_clip_boundary() -> None:
    log_prob, old, r = _exact_ratio_case(math.log(3.0))
    adv = torch.tensor([[-1.0]])
    at = ppo_clip_token_losses(log_prob, old, adv, 0.2, None, r)  # c == r exactly
    assert not at.dual_clipped.item()
    assert _grad(at.losses, log_prob) == pytest.approx(r)
    past = ppo_clip_token_losses(log_prob, old, adv, 0.2, None, r - 1e-3)
    assert past.dual_clipped.item()
    assert past.losses.item() == pytest.approx(r - 1e-3, rel=1e-6)
    assert _grad(past.losses, log_prob) == 0.0
    # dual clip never applies to positive advantages
    pos = ppo_clip_token_losses(log_prob, old, torch.tensor([[1.0]]), 0.2, None, 1.5)
    assert not pos.dual_clipped.item() and pos.clipped.item()


def test_gradients_zero_exactly_where_clipped() -> None:
    ratios = [0.5, 1.0, 1.5, 0.5, 1.0, 2.0, 5.0, 1.3]
    advs = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 0.0]
    zero_grad = [False, False, True, True, False, False, True, True]  # A=0 -> 0 gradient too
    log_prob, old, adv = _tokens(ratios, advs)
    out = ppo_clip_token_losses(log_prob, old, adv, 0.2, None, 3.0)
    (g,) = torch.autograd.grad(out.losses.sum(), log_prob)
    for i, (a, r) in enumerate(zip(advs, ratios)):
        expected = 0.0 if zero_grad[i] else -a * r
        assert g[0, i].item() == pytest.approx(expected, abs=1e-6), i


def test_dual_clip_disabled() -> None:
    log_prob, old, adv = _tokens([5.0], [-1.0])
    out = ppo_clip_token_losses(log_prob, old, adv, 0.2, None, None)
    assert out.losses.item() == pytest.approx(5.0, rel=1e-6)
    assert not out.dual_clipped.any()
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_token_losses(log_prob, old, adv, 0.2, None, 1.0)


def test_token_weights_scale_loss_and_gradient() -> None:
    log_prob, old, adv = _tokens([1.1, 0.9], [1.0, -1.0])
    mask = torch.ones(1, 2)
    w = torch.tensor([[2.0, 0.5]], requires_grad=True)
    out = compute_policy_loss(log_prob, old, adv, mask, token_weights=w)
    assert out.loss.item() == pytest.approx((2.0 * -1.1 + 0.5 * 0.9) / 2, rel=1e-6)
    (g,) = torch.autograd.grad(out.loss, log_prob)
    torch.testing.assert_close(g, torch.tensor([[2.0 * -1.1 / 2, 0.5 * 0.9 / 2]]))


def test_padding_does_not_leak_and_empty_batch_is_finite() -> None:
    log_prob = torch.tensor([[0.1, 30.0], [-30.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    mask = torch.tensor([[1, 0], [0, 0]])
    out = compute_policy_loss(log_prob, old, adv, mask, loss_agg_mode="seq-mean-token-mean")
    assert out.loss.item() == pytest.approx(-math.exp(0.1), rel=1e-6)
    assert out.pg_clipfrac == 0.0 and out.ppo_kl == pytest.approx(-0.1)
    empty = compute_policy_loss(log_prob, old, adv, torch.zeros(2, 2))
    assert empty.loss.item() == 0.0 and empty.pg_clipfrac == 0.0 and empty.ppo_kl == 0.0
    (g,) = torch.autograd.grad(empty.loss, log_prob)
    assert torch.equal(g, torch.zeros(2, 2))


def test_bf16_inputs_are_computed_in_fp32() -> None:
    log_prob, old, adv = _tokens([1.1, 0.9], [1.0, -1.0])
    out = ppo_clip_token_losses(log_prob.bfloat16(), old.bfloat16(), adv.bfloat16())
    assert out.losses.dtype == torch.float32
