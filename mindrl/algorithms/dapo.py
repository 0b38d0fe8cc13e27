"""DAPO data filters: dynamic sampling (drop groups whose rewards all tie) and overlong
filtering (drop responses cut at max length).

A group whose rewards tie has zero advantage for every sample: it costs a training pass and
contributes no gradient, so DAPO resamples until the batch holds informative groups only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
class DynamicSampler:
    """Accumulates informative groups over rollout rounds until `target_groups` are kept.

    Round 1 is the first rollout; up to `max_resample_times` more may follow. Each `add`
    returns the sample indices to keep from that round, trimmed so the total is exactly the
    target. When rounds run out first, `done` is true and `satisfied` false: the caller
    decides whether to train on fewer groups or pad with tied ones.
    """

    target_groups: int
    group_size: int
    max_resample_times: int = 3
    rounds: int = 0
    num_groups: int = 0
    seen_groups: int = 0

    def __post_init__(self) -> None:
        if self.target_groups < 1 or self.group_size < 1 or self.max_resample_times < 0:
            raise ValueError("need target_groups >= 1, group_size >= 1, max_resample_times >= 0")

    @property
    def satisfied(self) -> bool:
        return self.num_groups >= self.target_groups

    @property
    def done(self) -> bool:
        return self.satisfied or self.rounds >= 1 + self.max_resample_times

    def add(self, scores: torch.Tensor) -> torch.Tensor:
        """Register one round's scores [n_groups * group_size]; return sample indices to keep."""
        if self.done:
            raise RuntimeError("DynamicSampler is done; start a new one for the next step")
        self.rounds += 1
        self.seen_groups += scores.numel() // self.group_size
        groups = informative_groups(scores, self.group_size)
        groups = groups[: self.target_groups - self.num_groups]
        self.num_groups += int(groups.numel())
        return group_sample_indices(groups, self.group_size)


@dataclass(frozen=True)
class DynamicSamplingResult:
    kept: list[torch.Tensor]  # per round used: sample indices kept from that round
    rounds_used: int
    num_groups: int
    satisfied: bool


def accumulate_groups(
    score_rounds: Iterable[torch.Tensor],
    group_size: int,
    target_groups: int,
    max_resample_times: int = 3,
) -> DynamicSamplingResult:
    """Pull rounds from `score_rounds` (lazily: a generator may roll out on demand) until
    `target_groups` informative groups are kept or 1 + max_resample_times rounds are used."""
    sampler = DynamicSampler(target_groups, group_size, max_resample_times)
    kept: list[torch.Tensor] = []
    for scores in score_rounds:
        kept.append(sampler.add(scores))
        if sampler.done:
            break
    return DynamicSamplingResult(kept, sampler.rounds, sampler.num_groups, sampler.satisfied)


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
