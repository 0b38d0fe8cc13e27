"""Token-level returns on hand-computed episodes: GAE, discounted returns, REINFORCE++'s batch
normalisation, and REINFORCE++ through the driver's advantage step (KL into the reward)."""

from __future__ import annotations

import pytest
import torch

from mindrl.algorithms import compute_advantages
from mindrl.algorithms.returns import (
    discounted_returns,
    gae_advantages,
    outcome_token_rewards,
    reinforce_plus_plus_advantages,
)

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def test_gae_on_a_three_token_episode():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])  # 9.0 is padding
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 1.0, 5.0]])
    adv, ret = gae_advantages(rewards, values, MASK, gamma=0.9, lam=0.8)
    # row 0: delta = (0.3, 0.03, 0.04) from the end; A_t = delta_t + 0.72 A_{t+1}
    assert adv[0].tolist() == pytest.approx([0.04 + 0.72 * (0.03 + 0.72 * 0.3), 0.246, 0.3])
    assert ret[0].tolist() == pytest.approx([0.21712 + 0.5, 0.246 + 0.6, 1.0])
    # row 1 ends at its second token: nothing flows back from padding
    assert adv[1].tolist() == pytest.approx([-0.1 + 0.72 * 1.0, 1.0, 0.0])
    assert ret[1].tolist() == pytest.approx([1.62, 2.0, 0.0])
    # lam = 1, gamma = 1: the advantage is the Monte-Carlo return minus the value
    adv1, _ = gae_advantages(rewards, values, MASK, gamma=1.0, lam=1.0)
    assert adv1[0].tolist() == pytest.approx([0.5, 0.4, 0.3])


def test_discounted_returns_and_outcome_rewards():
    scores = torch.tensor([1.0, -1.0])
    tokens = outcome_token_rewards(scores, MASK)
    assert tokens.tolist() == [[0.0, 0.0, 1.0], [0.0, -1.0, 0.0]]
    assert discounted_returns(tokens, MASK, 0.5).tolist() == [[0.25, 0.5, 1.0], [-0.5, -1.0, 0.0]]
    empty = torch.zeros(1, 3, dtype=torch.bool)
    assert outcome_token_rewards(torch.tensor([3.0]), empty).abs().sum() == 0


def test_reinforce_plus_plus_whitens_the_returns_over_the_batch():
    tokens = outcome_token_rewards(torch.tensor([1.0, -1.0]), MASK)
    adv = reinforce_plus_plus_advantages(tokens, MASK, gamma=1.0)
    returns = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0])  # the 5 valid tokens
    expected = (returns - returns.mean()) / torch.sqrt(returns.var() + 1e-8)  # unbiased var
    assert adv[MASK].tolist() == pytest.approx(expected.tolist(), rel=1e-5)
    assert adv[~MASK].abs().sum() == 0
    # the same through the estimator's name (outcome scores in, no group needed)
    via_name = compute_advantages("reinforce_plus_plus", torch.tensor([1.0, -1.0]), 1, MASK)
    assert torch.equal(via_name, adv)


def test_reinforce_plus_plus_takes_the_token_kl_from_the_reward():
    """With use_kl_in_reward the per-token KL penalty enters the returns of every earlier
    token (the group estimators only see its sequence total)."""
    from mindrl.algorithms.kl import FixedKLController
    from mindrl.config import load_run_config
    from mindrl.data.batch import build_sample_batch
    from mindrl.trainer.advantage_step import compute_step_advantages

    run, _ = load_run_config(
        "grpo_tiny_cpu",
        [
            "rl_config.adv_estimator=reinforce_plus_plus",
            "rl_config.use_kl_in_reward=true",
            "rl_config.use_kl_loss=false",
            "rl_config.init_kl_coef=0.5",
            "rl_config.kl_penalty=kl",
            "rl_config.n_samples_per_prompt=2",
        ],
        check_paths=False,
    )
    alg = run.rl.algorithm
    batch = build_sample_batch([[5, 6], [5, 6]], [[7, 8, 9], [7, 8]], 0)
    mask = batch.response_mask
    old = torch.zeros(mask.shape)
    ref = torch.where(mask.bool(), torch.full(mask.shape, -0.2), 0.0)  # k1 KL = 0.2 per token
    out = compute_step_advantages(
        batch, torch.tensor([1.0, 0.0]), alg, FixedKLController(0.5), old_lp=old, ref_lp=ref
    )
    valid = mask.bool()
    token_rewards = outcome_token_rewards(torch.tensor([1.0, 0.0]), valid) - 0.5 * 0.2 * valid
    expected = reinforce_plus_plus_advantages(token_rewards, valid, alg.gamma)
    assert torch.allclose(out.values, expected)
    first = out.values[0][valid[0]]
    assert first[0] < first[-1]  # earlier tokens carry more of the penalty
