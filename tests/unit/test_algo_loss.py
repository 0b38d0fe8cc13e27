"""grpo_loss: pg + KL loss - entropy bonus, against a per-token loop reference."""

from __future__ import annotations

import math

import pytest
import torch

from mindrl.algorithms.loss import GRPOLossConfig, grpo_loss


def _case(seed: int = 0, b: int = 4, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 2
    log_prob = old + torch.randn(b, t, generator=g) * 0.3
    ref = old + torch.randn(b, t, generator=g) * 0.2
    adv = torch.randn(b, 1, generator=g).expand(b, t).clone()
    entropy = torch.rand(b, t, generator=g) * 2
    rollout = old + torch.randn(b, t, generator=g) * 0.5
    mask = torch.ones(b, t)
    mask[1, 3:] = 0
    mask[2] = 0  # a zero-length response
    return log_prob, old, ref, adv, entropy, rollout, mask


def _ref_pg(a: float, lp: float, old: float, cfg: GRPOLossConfig) -> float:
    r = math.exp(lp - old)
    hi = cfg.clip_ratio if cfg.clip_ratio_high is None else cfg.clip_ratio_high
    loss = max(-a * r, -a * min(max(r, 1 - cfg.clip_ratio), 1 + hi))
    if cfg.clip_ratio_c is not None and a < 0:
        loss = min(loss, -a * cfg.clip_ratio_c)
    return loss


def _ref_k3(lp: float, rf: float) -> float:
    return min(max(math.exp(rf - lp) - (rf - lp) - 1, -10.0), 10.0)


def _ref_agg(mat: list[list[float]], mask: list[list[float]], mode: str) -> float:
    if mode == "token-mean":
        vals = [v for row, m in zip(mat, mask) for v, k in zip(row, m) if k]
        return sum(vals) / len(vals)
    rows = [[v for v, k in zip(row, m) if k] for row, m in zip(mat, mask)]
    rows = [r for r in rows if r]
    return sum(sum(r) / len(r) for r in rows) / len(rows)  # seq-mean-token-mean


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("use_tis", [False, True])
def test_combined_loss_matches_loop(mode: str, use_tis: bool) -> None:
    log_prob, old, ref, adv, entropy, rollout, mask = _case()
    cfg = GRPOLossConfig(
        clip_ratio=0.2,
        clip_ratio_high=0.28,
        loss_agg_mode=mode,
        use_kl_loss=True,
        kl_loss_coef=0.05,
        kl_penalty="low_var_kl",
        entropy_coeff=0.01,
        use_tis=use_tis,
        rollout_is_threshold=1.5,
    )
    loss, metrics = grpo_loss(
        cfg, log_prob, old, adv, mask, ref_log_prob=ref, entropy=entropy, rollout_log_prob=rollout
    )
    L, OLD, R, A, E, RO, M = (x.tolist() for x in (log_prob, old, ref, adv, entropy, rollout, mask))
    pg, kl = [], []
    for b in range(len(L)):
        pg_row, kl_row = [], []
        for t in range(len(L[0])):
            w = min(math.exp(OLD[b][t] - RO[b][t]), 1.5) if use_tis else 1.0
            pg_row.append(w * _ref_pg(A[b][t], L[b][t], OLD[b][t], cfg))
            kl_row.append(_ref_k3(L[b][t], R[b][t]))
        pg.append(pg_row)
        kl.append(kl_row)
    pg_loss, kl_loss, ent = _ref_agg(pg, M, mode), _ref_agg(kl, M, mode), _ref_agg(E, M, mode)
    assert loss.item() == pytest.approx(pg_loss + 0.05 * kl_loss - 0.01 * ent, rel=1e-5)
    assert metrics["actor/pg_loss"] == pytest.approx(pg_loss, rel=1e-5)
    assert metrics["actor/kl_loss"] == pytest.approx(kl_loss, rel=1e-5)
    assert metrics["actor/entropy"] == pytest.approx(ent, rel=1e-5)
    valid = [(b, t) for b in range(len(M)) for t in range(len(M[0])) if M[b][t]]
    ppo_kl = sum(OLD[b][t] - L[b][t] for b, t in valid) / len(valid)
    assert metrics["actor/ppo_kl"] == pytest.approx(ppo_kl, rel=1e-5)
    for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/kl_coef"):
        assert isinstance(metrics[key], float)
    assert ("actor/rollout_is_mean" in metrics) == use_tis


def test_gradient_matches_hand_derivation() -> None:
    # token-mean over N valid tokens; for an unclipped token
    # d/dlogp = (-A r + kl_coef * (1 - e^(ref - logp))) / N; clipped token: kl term only.
    log_prob = torch.tensor([[0.1, 0.5], [-0.1, 0.0]], requires_grad=True)
    old = torch.zeros(2, 2)
    ref = torch.tensor([[0.0, 0.2], [0.3, 9.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    cfg = GRPOLossConfig(use_kl_loss=True, kl_loss_coef=0.1)
    loss, _ = grpo_loss(cfg, log_prob, old, adv, mask, ref_log_prob=ref)
    (g,) = torch.autograd.grad(loss, log_prob)

    def kl_grad(lp: float, rf: float) -> float:
        return 0.1 * (1 - math.exp(rf - lp))

    expected = [
        [(-math.exp(0.1) + kl_grad(0.1, 0.0)) / 3, kl_grad(0.5, 0.2) / 3],  # r=e^.5 > 1.2: clipped
        [(math.exp(-0.1) + kl_grad(-0.1, 0.3)) / 3, 0.0],
    ]
    torch.testing.assert_close(g, torch.tensor(expected))


def test_entropy_bonus_gradient_sign() -> None:
    entropy = torch.tensor([[1.0, 2.0]], requires_grad=True)
    log_prob = torch.zeros(1, 2, requires_grad=True)
    cfg = GRPOLossConfig(entropy_coeff=0.5)
    loss, metrics = grpo_loss(
        cfg, log_prob, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), entropy=entropy
    )
    (g,) = torch.autograd.grad(loss, entropy)
    torch.testing.assert_close(g, torch.tensor([[-0.25, -0.25]]))  # minimising raises entropy
    assert metrics["actor/entropy"] == pytest.approx(1.5)


def test_kl_reported_but_not_added_without_use_kl_loss() -> None:
    log_prob, old, ref, adv, _, _, mask = _case(1)
    cfg = GRPOLossConfig()
    with_ref, m = grpo_loss(cfg, log_prob, old, adv, mask, ref_log_prob=ref)
    without, m0 = grpo_loss(cfg, log_prob, old, adv, mask)
    assert with_ref.item() == without.item()
    assert m["actor/kl_loss"] > 0 and "actor/kl_loss" not in m0 and "actor/kl_coef" not in m


def test_all_masked_batch_is_finite_with_zero_grad() -> None:
    log_prob, old, ref, adv, entropy, rollout, _ = _case(2)
    log_prob.requires_grad_(True)
    cfg = GRPOLossConfig(use_kl_loss=True, entropy_coeff=0.01, use_tis=True)
    mask = torch.zeros_like(old)
    loss, metrics = grpo_loss(
        cfg, log_prob, old, adv, mask, ref_log_prob=ref, entropy=entropy, rollout_log_prob=rollout
    )
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in metrics.values())
    (g,) = torch.autograd.grad(loss, log_prob)
    assert torch.equal(g, torch.zeros_like(g))


def test_missing_inputs_and_bad_config() -> None:
    log_prob, old, _, adv, _, _, mask = _case()
    with pytest.raises(ValueError, match="ref_log_prob"):
        grpo_loss(GRPOLossConfig(use_kl_loss=True), log_prob, old, adv, mask)
    with pytest.raises(ValueError, match="entropy"):
        grpo_loss(GRPOLossConfig(entropy_coeff=0.1), log_prob, old, adv, mask)
    with pytest.raises(ValueError, match="rollout_log_prob"):
        grpo_loss(GRPOLossConfig(use_tis=True), log_prob, old, adv, mask)
    for bad in (
        {"clip_ratio": 1.5},
        {"clip_ratio_high": -0.1},
        {"clip_ratio_c": 1.0},
        {"loss_agg_mode": "sum"},
        {"kl_penalty": "full"},
        {"rollout_is_threshold": 0.0},
        {"rollout_is_level": "batch"},
        {"rollout_is_mode": "clip"},
        {"rollout_is_threshold": 2.0, "rollout_is_threshold_lower": 2.0},
        {"entropy_coeff": -1.0},
        {"loss_agg_horizon": 0},
    ):
        with pytest.raises(ValueError):
            GRPOLossConfig(**bad)


def test_the_loss_knobs_and_their_rules_are_written_once() -> None:
    """rl_config's AlgorithmConfig inherits the loss knobs: a bad YAML value is reported once,
    with its key path, in the words a direct construction gets."""
    from mindrl.config.fields import _Problems, build_groups
    from mindrl.config.rl import RL_GROUPS, AlgorithmConfig

    assert issubclass(AlgorithmConfig, GRPOLossConfig)
    problems = _Problems()
    build_groups(RL_GROUPS, {"clip_ratio": 1.5, "loss_mode": "x"}, "rl_config", problems)
    assert problems.items == [
        "rl_config.clip_ratio: 1.5 is out of range (must be <= 1.0)",
        "rl_config.loss_mode: 'x' is not one of ['vanilla', 'gspo']",
    ]
    with pytest.raises(ValueError, match=r"^clip_ratio: 1.5 is out of range \(must be <= 1.0\)$"):
        GRPOLossConfig(clip_ratio=1.5)


def test_config_is_frozen() -> None:
    cfg = GRPOLossConfig()
    with pytest.raises(AttributeError):
        cfg.clip_ratio = 0.3  # type: ignore[misc]
