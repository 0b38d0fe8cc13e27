"""The PPO critic's loss: squared error to the GAE returns, with the prediction clipped to
`cliprange_value` around the values seen at rollout (PPO2's value clipping, as MindSpeed-RL's
and verl's critics compute it):

    vf_loss = 0.5 * mean_t max((V_t - R_t)^2, (clip(V_t, v_t - c, v_t + c) - R_t)^2)

The mean runs over the response tokens of the whole mini-batch (`normalizer`: its token count
over every DP rank), so micro-batch and DP splits add up to the same loss.
"""

from __future__ import annotations

import torch


def clipped_value_loss(
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    normalizer: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics) of one micro-batch; the loss is this micro-batch's share of the
    mini-batch mean."""
    mask = response_mask.float()
    # clamp keeps an unclipped prediction bit-identical (old + (v - old) may not be)
    clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_err = (vpreds - returns) ** 2
    clipped_err = (clipped - returns) ** 2
    loss = 0.5 * (torch.maximum(unclipped_err, clipped_err) * mask).sum() / max(normalizer, 1.0)
    tokens = mask.sum().clamp(min=1.0)
    metrics = {
        "critic/vf_loss": float(loss.detach()),
        "critic/vf_clipfrac": float(((clipped_err > unclipped_err).float() * mask).sum() / tokens),
        "critic/vpred_mean": float((vpreds.detach() * mask).sum() / tokens),
    }
    return loss, metrics
