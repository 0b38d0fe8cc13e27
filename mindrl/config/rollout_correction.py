"""Which rollout-correction keys take effect: `use_tis` switches the correction on (on by
default where samples hold tokens of older policies, `config.pipeline`), the rollout_is_*
keys (verl's names) say how. A how-key set while the correction is off, and mask mode's
lower threshold under truncate, are warned once as having no effect."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mindrl.config.fates import is_default, warn_once
from mindrl.config.rl import AlgorithmConfig

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig

HOW_KEYS = (
    "rollout_is_level",
    "rollout_is_mode",
    "rollout_is_threshold",
    "rollout_is_threshold_lower",
)


def rollout_correction_problems(run: RunConfig) -> list[str]:
    """Warns the keys without effect; every setting is allowed (no problems)."""
    alg = run.rl.algorithm
    fields = {f.name: f for f in dataclasses.fields(AlgorithmConfig)}
    changed = [n for n in HOW_KEYS if not is_default(fields[n], getattr(alg, n))]
    if not alg.use_tis:
        for name in changed:
            warn_once(
                f"rollout_correction.{name}",
                f"rl_config.{name}: {getattr(alg, name)} has no effect: the rollout correction "
                "is off (use_tis: false; on by default with rollout_staleness >= 1 and with "
                "partial rollout)",
            )
    elif alg.rollout_is_mode == "truncate" and "rollout_is_threshold_lower" in changed:
        warn_once(
            "rollout_correction.rollout_is_threshold_lower",
            f"rl_config.rollout_is_threshold_lower: {alg.rollout_is_threshold_lower} has no "
            "effect with rollout_is_mode: truncate (it clips at rollout_is_threshold only; "
            "mask mode reads the lower threshold)",
        )
    return []
