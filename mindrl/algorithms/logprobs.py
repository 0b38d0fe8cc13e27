"""Token log-probs and entropy from (unsharded) logits.

Logits are upcast to fp32 before any exp: bf16 log-probs differ from fp32 ones by up to
~0.03, which would show up directly in the importance ratio.
"""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: logsumexp(z) - sum softmax(z) * z."""
    z = logits.float()
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position: logits [..., V], labels [...] -> [...]."""
    z = logits.float()
    picked = torch.gather(z, -1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)
