"""GSPO's sequence-level ratio and clipping, and Dr.GRPO's constant horizon, on hand-computed
examples."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mindrl.algorithms import grpo_loss
from mindrl.algorithms.aggregation import aggregate_loss
from mindrl.algorithms.policy_loss import gspo_token_losses, sequence_clipfrac, sequence_log_ratio
from mindrl.config import load_run_config

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
OLD = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-1.5, -0.2, -9.0, -9.0]])
# new - old per valid token: row 0: +0.3, -0.6, +0.9 (mean +0.2); row 1: +0.1, +0.5 (mean +0.3)
NEW = OLD + torch.tensor([[0.3, -0.6, 0.9, 5.0], [0.1, 0.5, 7.0, -3.0]])


def test_the_sequence_ratio_is_the_geometric_mean_of_the_token_ratios():
    log_seq = sequence_log_ratio(NEW, OLD, MASK)
    assert log_seq[:, 0].tolist() == pytest.approx([0.2, 0.3])
    token_ratios = torch.exp(NEW - OLD)
    geo0 = (token_ratios[0, 0] * token_ratios[0, 1] * token_ratios[0, 2]) ** (1 / 3)
    assert math.exp(float(log_seq[0])) == pytest.approx(float(geo0))


def test_every_token_carries_its_sequence_ratio_and_the_gradient_is_spread_by_length():
    new = NEW.clone().requires_grad_(True)
    adv = torch.tensor([[1.0] * 4, [-2.0] * 4]) * MASK
    tokens = gspo_token_losses(new, OLD, adv, MASK, clip_ratio=0.5, clip_ratio_high=0.5)
    s = [math.exp(0.2), math.exp(0.3)]
    assert tokens.ratio[0, :3].tolist() == pytest.approx([s[0]] * 3)
    assert tokens.ratio[1, :2].tolist() == pytest.approx([s[1]] * 2)
    assert not tokens.clipped.any()
    loss = aggregate_loss(tokens.losses, MASK, "seq-mean-token-mean")
    # (1/2) * sum_i (1/|y_i|) sum_t -A_i s_i: row 0 gives -s0, row 1 gives +2 s1
    assert float(loss.detach()) == pytest.approx((-s[0] + 2 * s[1]) / 2)
    loss.backward()
    # d/d log pi(y_i,t) = -A_i s_i / (|y_i| * 2 sequences)
    assert new.grad[0, :3].tolist() == pytest.approx([-s[0] / 3 / 2] * 3)
    assert new.grad[1, :2].tolist() == pytest.approx([2 * s[1] / 2 / 2] * 2)
    assert new.grad[MASK.logical_not()].abs().sum() == 0


def test_a_sequence_outside_its_range_is_clipped_as_a_whole():
    new = NEW.clone().requires_grad_(True)
    adv = torch.tensor([[1.0] * 4, [1.0] * 4]) * MASK
    # eps_high 0.25: s0 = e^0.2 = 1.221 stays, s1 = e^0.3 = 1.350 is clipped (A > 0)
    tokens = gspo_token_losses(new, OLD, adv, MASK, clip_ratio=0.2, clip_ratio_high=0.25)
    assert tokens.clipped[0].sum() == 0 and tokens.clipped[1, :2].all()
    assert tokens.losses[1, :2].tolist() == pytest.approx([-1.25, -1.25])
    assert sequence_clipfrac(tokens, MASK) == 0.5
    aggregate_loss(tokens.losses, MASK, "seq-mean-token-mean").backward()
    assert new.grad[1].abs().sum() == 0 and new.grad[0, :3].abs().sum() > 0


def test_gspo_through_the_grpo_loss_and_its_config_key():
    run, _ = load_run_config(
        "grpo_tiny_cpu",
        ["rl_config.loss_mode=gspo", "rl_config.loss_agg_mode=seq-mean-token-mean"],
        check_paths=False,
    )
    cfg = run.rl.algorithm.loss_config()
    assert cfg.policy_loss == "gspo"
    adv = torch.tensor([[1.0] * 4, [-2.0] * 4]) * MASK
    loss, metrics = grpo_loss(cfg, NEW, OLD, adv, MASK, ref_log_prob=OLD)
    vanilla_cfg = dataclasses.replace(cfg, policy_loss="vanilla")
    vanilla, _ = grpo_loss(vanilla_cfg, NEW, OLD, adv, MASK, ref_log_prob=OLD)
    assert float(loss) != pytest.approx(float(vanilla))
    assert metrics["actor/ppo_kl"] == pytest.approx(-float((NEW - OLD)[MASK].mean()))


def test_dr_grpo_divides_every_micro_batch_by_the_configured_horizon():
    run, _ = load_run_config(
        "grpo_tiny_cpu", ["rl_config.loss_agg_mode=seq-mean-token-sum-norm"], check_paths=False
    )
    max_tokens = run.generate.sampling_config.max_tokens
    cfg = run.rl.algorithm.loss_config(max_tokens)
    assert cfg.loss_agg_horizon == max_tokens
    set_h, _ = load_run_config(
        "grpo_tiny_cpu",
        ["rl_config.loss_agg_mode=seq-mean-token-sum-norm", "rl_config.loss_agg_horizon=100"],
        check_paths=False,
    )
    assert set_h.rl.algorithm.loss_config(max_tokens).loss_agg_horizon == 100
    # two micro-batches of different widths: each response's token sum / the same constant
    wide = torch.ones(2, 7)
    narrow = torch.ones(2, 3)
    for losses in (wide, narrow):
        mask = torch.ones_like(losses, dtype=torch.bool)
        got = aggregate_loss(losses, mask, cfg.loss_agg_mode, horizon=cfg.loss_agg_horizon)
        assert float(got) == pytest.approx(losses.shape[1] / max_tokens)
    # other modes take no horizon
    plain, _ = load_run_config("grpo_tiny_cpu", [], check_paths=False)
    assert plain.rl.algorithm.loss_config(max_tokens).loss_agg_horizon is None
