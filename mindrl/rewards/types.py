"""Value types every verifier sees: per-sample metadata and per-run verifier parameters.

The verifier contract (documented here once, used by the registry, the built-ins and the
scorer) is::

    def verifier(response: str, label: str, meta: SampleMeta | None = None) -> float

* `response` is the decoded completion only (no prompt, special tokens skipped);
* `label` is the ground truth string of the sample's dataset record;
* `meta` carries what length-aware rewards need (token length, generation limit, finish
  reason) plus `meta.params`, the run's `RewardParams`. `RewardScorer` always passes a
  `SampleMeta` whose `params` are the scorer's; a direct caller may omit it.

A verifier returns one finite float. Anything else (None, NaN, inf, a string), an exception,
a crash or a hang scores 0 for that sample and is counted by the scorer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RewardParams:
    """Parameters of the parametrized built-ins, named and defaulted as in ms-swift.

    `None` lengths fall back to the sample's `meta.max_length` (ms-swift defaults both to the
    generation limit, max_completion_length).
    """

    cosine_min_len_value_wrong: float = -0.5
    cosine_max_len_value_wrong: float = 0.0
    cosine_min_len_value_correct: float = 1.0
    cosine_max_len_value_correct: float = 0.5
    cosine_max_len: int | None = None
    repetition_n_grams: int = 3
    repetition_max_penalty: float = -1.0
    soft_max_length: int | None = None
    soft_cache_length: int | None = None
    # MindSpeed-RL's strict_format also demands exactly one \boxed{} inside <answer>.
    strict_format_require_boxed: bool = True

    def __post_init__(self) -> None:
        if self.cosine_max_len is not None and self.cosine_max_len <= 0:
            raise ValueError(f"cosine_max_len must be > 0, got {self.cosine_max_len}")
        if self.repetition_n_grams < 1:
            raise ValueError(f"repetition_n_grams must be >= 1, got {self.repetition_n_grams}")
        if self.repetition_max_penalty > 0:
            raise ValueError(
                f"repetition_max_penalty is a penalty (<= 0), got {self.repetition_max_penalty}"
            )
        if self.soft_cache_length is not None and self.soft_cache_length <= 0:
            raise ValueError(f"soft_cache_length must be > 0, got {self.soft_cache_length}")
        if self.soft_max_length is not None and self.soft_max_length <= 0:
            raise ValueError(f"soft_max_length must be > 0, got {self.soft_max_length}")
        if (
            self.soft_cache_length is not None
            and self.soft_max_length is not None
            and self.soft_cache_length > self.soft_max_length
        ):
            raise ValueError(
                f"soft_cache_length ({self.soft_cache_length}) must not exceed "
                f"soft_max_length ({self.soft_max_length})"
            )


@dataclass(frozen=True)
class SampleMeta:
    """Per-sample facts a verifier may use besides the text.

    response_length: generated tokens (what cosine / soft_overlong measure);
    max_length: the generation limit for this sample (sampling max_tokens);
    finish_reason: the engine's reason, e.g. "stop" or "length" (truncated);
    extra: other dataset columns, for custom verifiers;
    tool_calls: the tool calls of a multi-turn tool rollout (None without tools; retool_reward).
    """

    response_length: int | None = None
    max_length: int | None = None
    finish_reason: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    params: RewardParams = field(default_factory=RewardParams)
    tool_calls: int | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"
