"""DAPO data filters: dynamic sampling (drop groups whose rewards all tie) and overlong
filtering (drop responses cut at max length).

A group whose rewards tie has zero advantage for every sample: it costs a training pass and
contributes no gradient, so DAPO resamples until the batch holds informative groups only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Indices (int64) of the groups whose scores are not all equal, in batch order."""
    if group_size < 1 or scores.dim() != 1 or scores.numel() % group_size:
        raise ValueError(f"{tuple(scores.shape)} scores do not split into groups of {group_size}")
    groups = scores.view(-1, group_size)
    varied = groups.amax(dim=1) != groups.amin(dim=1)
    return torch.nonzero(varied).flatten()


def group_sample_indices(groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """Sample indices (int64, contiguous per group) of the given group indices."""
    offsets = torch.arange(group_size, dtype=torch.long, device=groups.device)
    return (groups.long()[:, None] * group_size + offsets).flatten()


@dataclass
class GroupFilter:
    """DAPO's dynamic sampling over the generation batches of one step (MindSpeed-RL's
    ``filter_groups_*``): each batch's groups whose metric varies are kept, in order, until
    `target_groups` are held; the surplus of the last batch is dropped. A group of one sample
    is always kept (its spread is undefined). `max_batches` <= 0 sets no limit.
    """

    target_groups: int
    group_size: int
    max_batches: int = 1
    batches: int = 0
    kept_groups: int = 0
    seen_groups: int = 0
    varied_groups: int = 0  # before the surplus is dropped

    def __post_init__(self) -> None:
        if self.target_groups < 1 or self.group_size < 1:
            raise ValueError("need target_groups >= 1 and group_size >= 1")

    @property
    def satisfied(self) -> bool:
        return self.kept_groups >= self.target_groups

    @property
    def exhausted(self) -> bool:
        """No batch may follow and the target is not met."""
        return not self.satisfied and 0 < self.max_batches <= self.batches

    def add(self, metric: torch.Tensor) -> torch.Tensor:
        """Register one generation batch's per-sample metric; the sample indices to keep."""
        if self.satisfied or self.exhausted:
            raise RuntimeError("GroupFilter is done; start a new one for the next step")
        self.batches += 1
        self.seen_groups += metric.numel() // self.group_size
        if self.group_size == 1:
            groups = torch.arange(metric.numel(), dtype=torch.long)
        else:
            groups = informative_groups(metric, self.group_size)
        self.varied_groups += int(groups.numel())
        groups = groups[: self.target_groups - self.kept_groups]
        self.kept_groups += int(groups.numel())
        return group_sample_indices(groups, self.group_size)


def overlong_buffer_penalty(
    response_lengths: torch.Tensor, max_tokens: int, buffer: int, factor: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the rule reward: 0 up to
    ``max_tokens - buffer`` generated tokens, then falling linearly to ``-factor`` at
    `max_tokens` (float32 [B])."""
    if not 0 < buffer < max_tokens:
        raise ValueError(f"overlong buffer {buffer} must be in (0, max_tokens {max_tokens})")
    exceed = (response_lengths.float() - (max_tokens - buffer)).clamp(max=buffer)
    return (-exceed / buffer * factor).clamp(max=0.0)


def truncated_responses(finish_reasons: Sequence[str]) -> torch.Tensor:
    """Bool [B]: True where generation stopped at max length ("length"), i.e. without EOS."""
    return torch.tensor([reason == "length" for reason in finish_reasons], dtype=torch.bool)


def overlong_filter(
    response_mask: torch.Tensor, truncated: torch.Tensor | Sequence[str]
) -> torch.Tensor:
    """Response mask with truncated rows zeroed, so they drop out of the loss entirely.

    `truncated` is a bool [B] or the rollout's finish reasons.
    """
    if not isinstance(truncated, torch.Tensor):
        truncated = truncated_responses(truncated)
    if truncated.shape != response_mask.shape[:1]:
        raise ValueError(f"truncated {tuple(truncated.shape)} vs mask {tuple(response_mask.shape)}")
    keep = (~truncated.bool()).to(response_mask.device, response_mask.dtype)[:, None]
    return response_mask * keep
