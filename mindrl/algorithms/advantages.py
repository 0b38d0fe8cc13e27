"""Outcome advantages for group-sampled responses (GRPO and relatives).

Samples of one prompt are contiguous: sample i belongs to group i // group_size. Every
estimator returns per-token advantages [B, T], the sequence advantage broadcast over the
response and zeroed on padding.

Standard deviation: the unbiased estimator (divide by n - 1), as torch.std and verl do, so
learning rates tuned there carry over (with n = 8 the biased std is ~6.5% smaller).
A group whose rewards all tie gets exactly 0, not (r - mean) / eps: the float mean of equal
values can differ from them by one ulp, which eps would blow up.
"""

from __future__ import annotations

import torch

from mindrl.algorithms.aggregation import masked_sum, whiten
from mindrl.algorithms.names import ADV_ALIASES, ADV_ESTIMATOR_NAMES, CRITIC_ESTIMATORS
from mindrl.algorithms.returns import outcome_token_rewards, reinforce_plus_plus_advantages


def _groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B] -> [B / group_size, group_size], checking the batch splits into whole groups."""
    if group_size < 2:
        raise ValueError(f"group advantages need group_size >= 2, got {group_size}")
    if scores.dim() != 1 or scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    return scores.view(-1, group_size)


def _centered(groups: torch.Tensor) -> torch.Tensor:
    """r - group mean, exactly 0 for tied groups."""
    tied = groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)
    centered = groups - groups.mean(dim=1, keepdim=True)
    return torch.where(tied, torch.zeros_like(centered), centered)


def group_norm_scores(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: (r - group mean) / (unbiased group std + eps), per sample [B]."""
    groups = _groups(scores.float(), group_size)
    std = groups.std(dim=1, keepdim=True)  # unbiased, see module docstring
    return (_centered(groups) / (std + eps)).reshape(-1)


def grpo_no_std_scores(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr.GRPO: r - group mean, without the std division (which favours easy/hard prompts)."""
    return _centered(_groups(scores.float(), group_size)).reshape(-1)


def rloo_scores(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO: r_i - mean of the other n - 1 rewards = n / (n - 1) * (r_i - group mean)."""
    centered = _centered(_groups(scores.float(), group_size))
    return (centered * (group_size / (group_size - 1))).reshape(-1)


def sequence_scores(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-sample reward [B]: `rewards` itself if [B], its masked token sum if [B, T]."""
    if rewards.dim() == 1:
        return rewards.float()
    if rewards.shape != response_mask.shape:
        raise ValueError(
            f"token rewards {tuple(rewards.shape)} != mask {tuple(response_mask.shape)}"
        )
    return masked_sum(rewards.float(), response_mask, dim=-1)


def compute_advantages(
    name: str,
    rewards: torch.Tensor,
    group_size: int,
    response_mask: torch.Tensor,
    eps: float = 1e-6,
    gamma: float = 1.0,
) -> torch.Tensor:
    """Token advantages [B, T] from rewards [B] (or token rewards [B, T], summed per sample
    by the group estimators).

    `name` is `rl_config.adv_estimator`: group_norm (alias grpo), grpo_no_std (alias
    dr_grpo), rloo, reinforce_plus_plus_baseline (group-mean baseline, then whitened over
    all valid tokens of the batch), reinforce_plus_plus (token returns discounted by
    `gamma`, whitened over the batch: `returns.reinforce_plus_plus_advantages`).
    """
    estimator = ADV_ALIASES.get(name, name)
    if estimator in CRITIC_ESTIMATORS:
        raise ValueError(
            f"adv_estimator {name!r} needs a critic's values: the PPO step computes it "
            "(returns.gae_advantages)"
        )
    if response_mask.dim() != 2 or response_mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"mask {tuple(response_mask.shape)} does not match rewards")
    if estimator == "reinforce_plus_plus":
        tokens = rewards if rewards.dim() == 2 else outcome_token_rewards(rewards, response_mask)
        return reinforce_plus_plus_advantages(tokens, response_mask, gamma)
    scores = sequence_scores(rewards, response_mask)
    if estimator == "group_norm":
        seq_adv = group_norm_scores(scores, group_size, eps)
    elif estimator == "grpo_no_std":
        seq_adv = grpo_no_std_scores(scores, group_size)
    elif estimator == "rloo":
        seq_adv = rloo_scores(scores, group_size)
    elif estimator == "reinforce_plus_plus_baseline":
        seq_adv = grpo_no_std_scores(scores, group_size)
    else:
        raise ValueError(f"unknown adv_estimator {name!r}; expected one of {ADV_ESTIMATOR_NAMES}")
    mask = response_mask.bool()
    token_adv = torch.where(mask, seq_adv[:, None], seq_adv.new_zeros(()))
    if estimator == "reinforce_plus_plus_baseline":
        token_adv = whiten(token_adv, mask)
    return token_adv
