"""KL estimators, KL controllers and the KL reward penalty."""

from __future__ import annotations

import math

import pytest
import torch

from mindrl.algorithms.advantages import compute_advantages
from mindrl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    KLControlConfig,
    kl_penalized_rewards,
    kl_penalty,
    make_kl_controller,
)

LOGP = [-1.0, -0.5, -2.0, -0.1, -3.0]
REF = [-1.5, -0.5, -0.2, -2.0, -0.4]


def _ref(kind: str, lp: float, rf: float) -> float:
    d = lp - rf
    if kind == "k1":
        return d
    if kind == "abs":
        return abs(d)
    if kind == "k2":
        return 0.5 * d * d
    log_r = rf - lp
    return min(max(math.exp(log_r) - log_r - 1.0, -10.0), 10.0)


@pytest.mark.parametrize(
    "kind,canonical",
    [("k1", "k1"), ("kl", "k1"), ("abs", "abs"), ("k2", "k2"), ("mse", "k2")]
    + [("k3", "k3"), ("low_var_kl", "k3")],
)
def test_estimators_match_formula(kind: str, canonical: str) -> None:
    got = kl_penalty(torch.tensor([LOGP]), torch.tensor([REF]), kind)
    expected = torch.tensor([[_ref(canonical, a, b) for a, b in zip(LOGP, REF)]])
    torch.testing.assert_close(got, expected)
    assert got.dtype == torch.float32


def test_low_var_kl_clamp_and_sign() -> None:
    # log r = ref - logp = 5 -> e^5 - 6 = 142.4 -> clamped to 10;
    # log r = -30 -> clamped to -20 first: e^-20 + 19 -> 10; log r = 2 -> e^2 - 3 = 4.389 (no clamp)
    logp = torch.tensor([[-5.0, -0.0, -2.0, -1.0]])
    ref = torch.tensor([[0.0, -30.0, 0.0, -1.0]])
    got = kl_penalty(logp, ref, "low_var_kl")
    torch.testing.assert_close(got, torch.tensor([[10.0, 10.0, math.exp(2) - 3.0, 0.0]]))
    assert (kl_penalty(torch.randn(4, 6), torch.randn(4, 6), "k3") >= 0).all()


def test_k3_gradient() -> None:
    # d/dlogp [e^(ref - logp) - (ref - logp) - 1] = 1 - e^(ref - logp)
    logp = torch.tensor([[-1.0, -0.3]], requires_grad=True)
    ref = torch.tensor([[-0.5, -0.3]])
    (g,) = torch.autograd.grad(kl_penalty(logp, ref, "k3").sum(), logp)
    torch.testing.assert_close(g, torch.tensor([[1 - math.exp(0.5), 0.0]]))


def test_unknown_type() -> None:
    with pytest.raises(ValueError, match="unknown kl type"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "full")


def test_adaptive_controller_hand_values() -> None:
    ctl = AdaptiveKLController(0.1, target_kl=6.0, horizon=10000)
    ctl.update(9.0, n_steps=100)  # error clip(0.5) = 0.2 -> x (1 + 0.2 * 100 / 10000)
    assert ctl.value == pytest.approx(0.1 * 1.002)
    ctl.update(6.6, n_steps=100)  # error 0.1 -> x 1.001
    assert ctl.value == pytest.approx(0.1 * 1.002 * 1.001)
    ctl.update(0.0, n_steps=1000)  # error clip(-1) = -0.2 -> x 0.98
    assert ctl.value == pytest.approx(0.1 * 1.002 * 1.001 * 0.98)
    restored = AdaptiveKLController(0.5, 6.0, 10000)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value


def test_fixed_controller_and_factory() -> None:
    ctl = make_kl_controller(KLControlConfig(type="fixed", kl_coef=0.05))
    assert type(ctl) is FixedKLController
    ctl.update(100.0, 64)
    assert ctl.value == 0.05
    adaptive = make_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.2, target_kl=1.0))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.horizon == 10000
    with pytest.raises(ValueError):
        KLControlConfig(type="pid")
    with pytest.raises(ValueError):
        KLControlConfig(type="adaptive", target_kl=0.0)


def test_kl_penalized_rewards_hand_example() -> None:
    scores = torch.tensor([1.0, 0.5, 2.0])
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-0.5, -2.0, 9.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -0.5, -1.0], [-1.0, -1.0, -9.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    out = kl_penalized_rewards(scores, logp, ref, mask, kl_coef=0.1, kl_type="k1")
    # k1 = logp - ref: row0 [0.5, -0.5, 0], row1 [0.5, -1.0, (pad)]
    expected_tokens = torch.tensor([[-0.05, 0.05, 1.0], [-0.05, 0.5 + 0.1, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(out.token_rewards, expected_tokens)
    # the empty row keeps its score in the sequence reward
    torch.testing.assert_close(out.seq_rewards, torch.tensor([1.0, 0.5 + 0.05, 2.0]))
    # mean over non-empty rows of per-row token means: mean(0 / 3, -0.5 / 2)
    assert out.mean_kl == pytest.approx(-0.125)


def test_kl_penalized_rewards_mask_with_hole_uses_last_valid_token() -> None:
    mask = torch.tensor([[1, 0, 1, 0]])
    out = kl_penalized_rewards(torch.tensor([3.0]), torch.zeros(1, 4), torch.zeros(1, 4), mask, 0.1)
    assert out.token_rewards.tolist() == [[0.0, 0.0, 3.0, 0.0]]


def test_seq_rewards_feed_advantages() -> None:
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    g = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    mask = torch.ones(4, 5)
    out = kl_penalized_rewards(scores, logp, ref, mask, 0.01, "k2")
    adv_seq = compute_advantages("grpo", out.seq_rewards, 2, mask)
    adv_tok = compute_advantages("grpo", out.token_rewards, 2, mask)
    torch.testing.assert_close(adv_seq, adv_tok)
