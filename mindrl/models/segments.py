"""Where each token of a packed (`thd`) micro-batch sits: its segment and its position in it.

Packed attention lays the segments side by side by these two indices, and the fused rope
rotates each token by the angle of its position within its own sequence.
"""

from __future__ import annotations

import torch


def segment_positions(cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment, position) of every packed token, both [cu_seqlens[-1]] long, from the
    segments' bounds `cu_seqlens` ([segments + 1], starting at 0)."""
    bounds = cu_seqlens.to(torch.long)
    lengths = bounds[1:] - bounds[:-1]
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=bounds.device), lengths)
    position = torch.arange(segment.numel(), device=bounds.device) - bounds[segment]
    return segment, position
