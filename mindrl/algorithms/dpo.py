"""DPO's pairwise losses from sequence log-probs (torch only).

With z = (log pi(y_c) - log pi(y_r)) - (log ref(y_c) - log ref(y_r)) for each pair, TRL's
DPOTrainer and MindSpeed-LLM's DPO trainer define:

    sigmoid  -(1 - eps) * log sigmoid(beta * z) - eps * log sigmoid(-beta * z)   (DPO; cDPO)
    hinge    relu(1 - beta * z)                                                   (SLiC)
    ipo      (z - 1 / (2 * beta))^2, log-probs averaged over each response's tokens

and the implicit rewards beta * (log pi(y) - log ref(y)) of each side (on the same log-probs
the loss reads). `pref_ftx` adds pref_ftx * (the chosen response's mean token NLL) to each
pair's loss, MindSpeed-LLM's SFT term. The mean over pairs divides by `normalizer` when given
(the pair count of the whole global batch), so micro-batch and data-parallel splits add up to
the global batch's mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mindrl.algorithms.dpo_config import DPOLossConfig
from mindrl.algorithms.names import LENGTH_AVERAGED_DPO_LOSSES


def sequence_log_probs(
    token_log_probs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's summed log-prob over its masked tokens, and its token count ([B] each)."""
    weights = mask.to(torch.float32)
    return (token_log_probs.float() * weights).sum(-1), weights.sum(-1)


def pair_losses(
    cfg: DPOLossConfig,
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair losses and the chosen / rejected implicit rewards (rewards carry no grad).

    The four inputs are [B] sequence log-probs, already averaged over tokens for the loss
    types in `LENGTH_AVERAGED_DPO_LOSSES`."""
    beta = cfg.dpo_beta
    z = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected)
    if cfg.dpo_loss_type == "sigmoid":
        eps = cfg.dpo_label_smoothing
        losses = -(1.0 - eps) * F.logsigmoid(beta * z) - eps * F.logsigmoid(-beta * z)
    elif cfg.dpo_loss_type == "hinge":
        losses = torch.relu(1.0 - beta * z)
    elif cfg.dpo_loss_type == "ipo":
        losses = (z - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"unknown dpo_loss_type {cfg.dpo_loss_type!r}")
    chosen_rewards = beta * (policy_chosen - reference_chosen).detach()
    rejected_rewards = beta * (policy_rejected - reference_rejected).detach()
    return losses, chosen_rewards, rejected_rewards


@dataclass(frozen=True)
class DPOLoss:
    """The scalar to backpropagate and its parts, summed over this micro-batch's pairs (the
    metric sums divide by the pair count once every micro-batch is in)."""

    loss: torch.Tensor
    pairs: int
    metric_sums: dict[str, float]


def dpo_loss(
    cfg: DPOLossConfig,
    policy_chosen_tokens: torch.Tensor,
    policy_rejected_tokens: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    chosen_mask: torch.Tensor,
    rejected_mask: torch.Tensor,
    *,
    normalizer: float | None = None,
) -> DPOLoss:
    """DPO loss of a micro-batch of pairs.

    `policy_*_tokens` are [B, T] per-token log-probs (with grad), `*_mask` their 0/1 response
    masks; `reference_*` are the reference's [B] summed sequence log-probs. Metric sums use
    TRL's names (`rewards/chosen`, `rewards/rejected`, `rewards/margins`,
    `rewards/accuracies`, `logps/chosen`, `logps/rejected`: summed log-probs)."""
    chosen_sum, chosen_len = sequence_log_probs(policy_chosen_tokens, chosen_mask)
    rejected_sum, rejected_len = sequence_log_probs(policy_rejected_tokens, rejected_mask)
    chosen_len = chosen_len.clamp(min=1.0)
    rejected_len = rejected_len.clamp(min=1.0)
    ref_chosen, ref_rejected = reference_chosen.float(), reference_rejected.float()
    if cfg.dpo_loss_type in LENGTH_AVERAGED_DPO_LOSSES:
        pol_c, pol_r = chosen_sum / chosen_len, rejected_sum / rejected_len
        ref_c, ref_r = ref_chosen / chosen_len, ref_rejected / rejected_len
    else:
        pol_c, pol_r, ref_c, ref_r = chosen_sum, rejected_sum, ref_chosen, ref_rejected
    losses, chosen_rewards, rejected_rewards = pair_losses(cfg, pol_c, pol_r, ref_c, ref_r)
    sums = {"dpo/pair_loss": float(losses.detach().sum())}
    if cfg.pref_ftx > 0:
        sft = -chosen_sum / chosen_len
        losses = losses + cfg.pref_ftx * sft
        sums["sft_loss"] = float(sft.detach().sum())
    pairs = int(losses.shape[0])
    denominator = float(normalizer) if normalizer is not None else float(max(pairs, 1))
    sums.update(
        {
            "rewards/chosen": float(chosen_rewards.sum()),
            "rewards/rejected": float(rejected_rewards.sum()),
            "rewards/margins": float((chosen_rewards - rejected_rewards).sum()),
            "rewards/accuracies": float((chosen_rewards > rejected_rewards).float().sum()),
            "logps/chosen": float(chosen_sum.detach().sum()),
            "logps/rejected": float(rejected_sum.detach().sum()),
        }
    )
    return DPOLoss(loss=losses.sum() / denominator, pairs=pairs, metric_sums=sums)


def pair_preference_accuracy(token_log_probs: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of pairs whose chosen answer the model itself finds likelier than the rejected
    one, per token (rows interleaved chosen, rejected; [2B, T] log-probs and 0/1 mask): a
    held-out measure that starts near chance for an untrained model, where DPO's reward
    accuracy starts at 0 (policy = reference gives every pair a zero margin)."""
    sums, lengths = sequence_log_probs(token_log_probs, mask)
    means = sums / lengths.clamp(min=1.0)
    return float((means[0::2] > means[1::2]).float().mean())
