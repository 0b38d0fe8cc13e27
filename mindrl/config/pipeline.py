"""The one-step-off pipeline's rules (`rl_config.rollout_staleness`).

Generation overlaps training only when the engines have devices of their own: in the hybrid
layout the actor's ranks generate, so there is nothing to overlap with. Samples one update
old are corrected by truncated importance sampling against the engine's log-probs, on unless
the YAML says `use_tis` itself. Staleness above 1 and DAPO's dynamic sampling (several
generation batches per step) are not built in this mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mindrl.config.rl import RLConfig
    from mindrl.config.run import RunConfig


def with_pipeline_defaults(rl: RLConfig, raw_rl: Mapping[str, Any], notes: list[str]) -> RLConfig:
    """Truncated importance sampling on in the pipeline unless `use_tis` is set in the YAML."""
    if rl.resources.rollout_staleness < 1 or "use_tis" in raw_rl:
        return rl
    notes.append(
        "rl_config.rollout_staleness: 1 trains on samples one update old: truncated importance "
        "sampling against the engine's log-probs is on (use_tis: true; set use_tis to choose)"
    )
    return dataclasses.replace(rl, algorithm=dataclasses.replace(rl.algorithm, use_tis=True))


def pipeline_problems(run: RunConfig) -> list[str]:
    staleness = run.rl.resources.rollout_staleness
    if staleness == 0:
        return []
    out = []
    if staleness > 1:
        out.append(
            f"rl_config.rollout_staleness: {staleness} is not built (1: the one-step-off "
            "pipeline; 0: synchronous)"
        )
    if run.hybrid_rollout:
        out.append(
            "rl_config.rollout_staleness: 1 generates beside training, which needs the rollout "
            "engines on devices of their own (set rl_config.rollout_resource, or "
            "generate_config.server)"
        )
    if run.filters_groups:
        out.append(
            "rl_config.rollout_staleness: 1 with DAPO's dynamic sampling (filter_groups_enable) "
            "is not built yet"
        )
    return out
