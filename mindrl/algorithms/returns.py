"""Token-level returns: outcome rewards placed on the last response token, discounted returns
(REINFORCE++), and generalised advantage estimation (PPO with a critic).

Token t of a row is valid where the response mask is set; valid tokens are contiguous from
the first response token. A row's episode ends at its last valid token: nothing flows back
from padding. Discounting runs right to left with gamma; GAE (Schulman et al. 2016) with
gamma and lam:

    delta_t = r_t + gamma * V_{t+1} - V_t          (V after the last valid token is 0)
    A_t     = delta_t + gamma * lam * A_{t+1}
    returns = A + V                                 (the critic's regression target)
"""

from __future__ import annotations

import torch

from mindrl.algorithms.aggregation import whiten


def last_valid_positions(response_mask: torch.Tensor) -> torch.Tensor:
    """[B] index of each row's last valid token, -1 for a row with none."""
    valid = response_mask.bool()
    positions = torch.arange(valid.shape[-1], device=valid.device).expand_as(valid)
    return torch.where(valid, positions, -1).amax(dim=-1)


def outcome_token_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] zeros with each sample's score on its last valid token (a row without valid
    tokens carries nothing)."""
    last = last_valid_positions(response_mask)
    out = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    rows = torch.nonzero(last >= 0).flatten()
    out[rows, last[rows]] = scores.float().to(out.device)[rows]
    return out


def discounted_returns(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over valid tokens, 0 on padding."""
    valid = response_mask.bool()
    rewards = torch.where(valid, token_rewards.float(), 0.0)
    out = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, 0.0)
        out[:, t] = running
    return out


def reinforce_plus_plus_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): discounted returns of the token rewards (the outcome score on
    the last token, and a per-token KL penalty when KL goes into the reward), whitened over
    every valid token of the batch: a batch baseline instead of a group one."""
    mask = response_mask.bool()
    return whiten(discounted_returns(token_rewards, mask, gamma), mask)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) [B, T] by GAE; both 0 on padding."""
    valid = response_mask.bool()
    rewards = torch.where(valid, token_rewards.float(), 0.0)
    vals = torch.where(valid, values.float(), 0.0)
    adv = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    next_value = torch.zeros_like(running)
    for t in range(rewards.shape[-1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        running = torch.where(valid[:, t], delta + gamma * lam * running, 0.0)
        next_value = torch.where(valid[:, t], vals[:, t], 0.0)
        adv[:, t] = running
    return adv, torch.where(valid, adv + vals, 0.0)
