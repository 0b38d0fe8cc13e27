"""The off-policy rollout modes' rules: the bounded-staleness pipeline
(`rl_config.rollout_staleness: k`) and partial rollout (`partial_rollout_max_split`).

Generation overlaps training only when the engines have devices of their own (a rollout
group or vLLM servers): in the hybrid layout the actor's ranks generate, so there is nothing
to overlap with. Samples up to k updates old are corrected by the rollout correction (truncated
importance sampling unless `rollout_is_*` choose another) against the engine's log-probs, on unless the YAML says `use_tis` itself. DAPO's dynamic
sampling (several generation batches per step) and partial rollout are not built in this
mode; partial rollout alone, which continues responses with newer weights, turns truncated
importance sampling on the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mindrl.config.rl import RLConfig
    from mindrl.config.run import RunConfig


def with_pipeline_defaults(rl: RLConfig, raw_rl: Mapping[str, Any], notes: list[str]) -> RLConfig:
    """The rollout correction on when samples hold tokens of older policies (the
    pipeline, partial rollout) unless `use_tis` is set in the YAML."""
    if "use_tis" in raw_rl:
        return rl
    if rl.resources.rollout_staleness >= 1:
        why = (
            f"rl_config.rollout_staleness: {rl.resources.rollout_staleness} trains on samples "
            "up to that many updates old"
        )
    elif rl.rollout_mode.partial_rollout_max_split > 1:
        why = "rl_config.partial_rollout_max_split > 1 continues responses with newer weights"
    else:
        return rl
    notes.append(
        f"{why}: the rollout correction against the engine's log-probs is on (use_tis: "
        "true; its level and mode from rl_config.rollout_is_*, token-level truncation unless "
        "they say otherwise; set use_tis to choose)"
    )
    return dataclasses.replace(rl, algorithm=dataclasses.replace(rl.algorithm, use_tis=True))


def pipeline_problems(run: RunConfig) -> list[str]:
    staleness = run.rl.resources.rollout_staleness
    if staleness == 0:
        return []
    out = []
    if run.hybrid_rollout:
        out.append(
            f"rl_config.rollout_staleness: {staleness} generates beside training, which needs "
            "the rollout engines on devices of their own (set rl_config.rollout_resource, or "
            "generate_config.server)"
        )
    if run.filters_groups:
        out.append(
            f"rl_config.rollout_staleness: {staleness} with DAPO's dynamic sampling "
            "(filter_groups_enable) is not built yet"
        )
    if run.rl.rollout_mode.partial_rollout_max_split > 1:
        out.append(
            f"rl_config.rollout_staleness: {staleness} with partial rollout "
            "(partial_rollout_max_split > 1) is not built yet"
        )
    return out


def partial_rollout_problems(run: RunConfig) -> list[str]:
    """Partial rollout's rules: a round must have a token to give, and DAPO's dynamic
    sampling (several fresh batches per step) does not combine with a pool of partial
    responses (not built)."""
    splits = run.rl.rollout_mode.partial_rollout_max_split
    if splits <= 1:
        return []
    out = []
    max_tokens = run.generate.sampling_config.max_tokens
    if max_tokens < splits:
        out.append(
            f"rl_config.partial_rollout_max_split: {splits} rounds cannot split "
            f"sampling_config.max_tokens ({max_tokens}): at most max_tokens"
        )
    if run.filters_groups:
        out.append(
            "rl_config.partial_rollout_max_split > 1 with DAPO's dynamic sampling "
            "(filter_groups_enable) is not built yet"
        )
    return out
