"""Token sampling math shared by the HF backend: the same knobs, in the same order, as vLLM.

vLLM's v1 sampler applies temperature, then min-p, then top-k and top-p, then draws; the
log-prob it reports is taken from the raw logits (``raw_logprobs``). These functions do the
same on a ``[batch, vocab]`` tensor so the HF backend samples from the same distribution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from mindrl.rollout.base import RolloutSampling


def filter_logits(logits: torch.Tensor, sampling: RolloutSampling) -> torch.Tensor:
    """Temperature-scaled logits with min-p, top-k and top-p cuts set to -inf (fp32)."""
    import torch

    out = logits.float() / sampling.temperature
    neg_inf = torch.finfo(out.dtype).min
    if sampling.min_p > 0:
        probs = out.softmax(-1)
        threshold = sampling.min_p * probs.amax(-1, keepdim=True)
        out = out.masked_fill(probs < threshold, neg_inf)
    if sampling.top_k > 0 and sampling.top_k < out.shape[-1]:
        kth = out.topk(sampling.top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, neg_inf)
    if sampling.top_p < 1:
        sorted_logits, order = out.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass strictly before it already reaches top_p; the most
        # likely token always survives.
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= sampling.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, neg_inf)
    return out


def sample_tokens(
    logits: torch.Tensor, sampling: RolloutSampling, generator: torch.Generator
) -> torch.Tensor:
    """Next token per row (``[batch]`` int64): argmax when greedy, else a filtered draw."""
    import torch

    if sampling.greedy:
        return logits.argmax(-1)
    probs = filter_logits(logits, sampling).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def raw_token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[token]`` per row in fp32: the raw-distribution log-prob."""
    return logits.float().log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
