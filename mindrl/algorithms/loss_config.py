"""The GRPO loss knobs: the one definition of their names, defaults and allowed ranges.

Torch-free, like `names`, so config validation can build on it without importing torch.
`mindrl.config.rl.AlgorithmConfig` inherits these fields (they are rl_config keys), and
mindrl's config builder checks the same range metadata when it reads the YAML, reporting a
bad value once, with its key path. `GRPOLossConfig.__post_init__` checks the rules for
code that builds the loss config directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mindrl.algorithms.names import (
    KL_TYPES,
    LOSS_AGG_MODES,
    POLICY_LOSS_MODES,
    ROLLOUT_IS_LEVELS,
    ROLLOUT_IS_MODES,
)


def knob(
    default: Any,
    *,
    help: str = "",
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    choices: tuple[Any, ...] | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A field whose allowed range is data (the metadata keys `mindrl.config.fields.spec`
    writes), so this module and the config builder read one rule."""
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "choices": choices, "aliases": aliases}
    return field(default=default, metadata=meta)


_BOUNDS = (("ge", ">=", float.__ge__), ("gt", ">", float.__gt__), ("le", "<=", float.__le__))


def broken_rule(name: str, value: Any, meta: Mapping[str, Any]) -> str | None:
    """Why `value` breaks the field's rule, worded as the config builder words it; None if
    it keeps it (None values are "unset" and always allowed)."""
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        return f"{name}: {value!r} is not one of {list(choices)}"
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    for key, word, ok in _BOUNDS:
        bound = meta.get(key)
        if bound is not None and not ok(float(value), float(bound)):
            return f"{name}: {value!r} is out of range (must be {word} {bound})"
    return None


@dataclass(frozen=True)
class GRPOLossConfig:
    """Loss knobs (rl_config names as in MindSpeed-RL and verl).

    clip_ratio is the low bound and the high one unless clip_ratio_high (DAPO/ms-swift
    `epsilon_high`) is set; clip_ratio_c is the dual-clip cap for negative advantages (None
    disables it). With use_tis, the rollout correction (`mindrl.algorithms.tis`) weighs or
    masks each token's pg loss by pi_old / pi_rollout at `rollout_is_level`, in
    `rollout_is_mode`, with `rollout_is_threshold` (verl's names). The loss reads `use_kl_loss` / `kl_loss_coef` as
    "KL in the loss, with this weight": `AlgorithmConfig.loss_config` resolves them from
    MindSpeed-RL's init_kl_coef or verl's switch.
    """

    clip_ratio: float = knob(0.2, gt=0.0, le=1.0)
    clip_ratio_high: float | None = knob(
        None, gt=0.0, le=1.0, aliases=("epsilon_high",), help="DAPO clip-higher upper bound"
    )
    clip_ratio_c: float | None = knob(
        3.0, gt=1.0, help="dual-clip bound for negative advantages (null: no dual clip)"
    )
    loss_agg_mode: str = knob("token-mean", choices=LOSS_AGG_MODES)
    loss_agg_horizon: int | None = knob(
        None,
        ge=1,
        help="seq-mean-token-sum-norm (Dr.GRPO): the constant each response's token sum is "
        "divided by; unset: generate_config.sampling_config.max_tokens (Dr.GRPO, TRL)",
    )
    policy_loss: str = knob(
        "vanilla",
        choices=POLICY_LOSS_MODES,
        aliases=("loss_mode",),
        help="vanilla: PPO's clip of each token's ratio; gspo: one ratio per sequence, the "
        "geometric mean of its token ratios, clipped per sequence (GSPO; use clip_ratio / "
        "clip_ratio_high ~3e-4 / 4e-4 and loss_agg_mode seq-mean-token-mean)",
    )
    kl_penalty: str = knob("low_var_kl", choices=KL_TYPES, help="KL estimator")
    use_kl_loss: bool = knob(False, help="verl's switch: KL loss with kl_loss_coef")
    kl_loss_coef: float = knob(0.001, ge=0.0, help="verl's KL-loss coefficient (use_kl_loss)")
    entropy_coeff: float = knob(0.0, ge=0.0)
    use_tis: bool = knob(
        False,
        help="rollout correction on: each token's pg loss weighted or masked by pi_old / "
        "pi_rollout as rollout_is_level / rollout_is_mode say (default token truncate: "
        "truncated importance sampling)",
    )
    rollout_is_level: str = knob(
        "token",
        choices=ROLLOUT_IS_LEVELS,
        help="token: one weight per token; sequence: the product of the sequence's token "
        "ratios; geometric: their geometric mean (both broadcast to the sequence's tokens)",
    )
    rollout_is_mode: str = knob(
        "truncate",
        choices=ROLLOUT_IS_MODES,
        help="truncate: weight min(w, rollout_is_threshold); mask: weight w inside "
        "[rollout_is_threshold_lower, rollout_is_threshold], 0 (token or sequence dropped) "
        "outside",
    )
    rollout_is_threshold: float = knob(
        2.0, gt=0.0, aliases=("tis_cap",), help="upper threshold on the importance weight"
    )
    rollout_is_threshold_lower: float | None = knob(
        None,
        gt=0.0,
        help="mask mode's lower threshold (null: 1 / rollout_is_threshold)",
    )

    def __post_init__(self) -> None:
        for f in fields(GRPOLossConfig):
            problem = broken_rule(f.name, getattr(self, f.name), f.metadata)
            if problem is not None:
                raise ValueError(problem)
        problem = rollout_is_bounds_problem(
            self.rollout_is_threshold_lower, self.rollout_is_threshold
        )
        if problem is not None:
            raise ValueError(problem)

    @property
    def rollout_is_bounds(self) -> tuple[float, float]:
        """(lower, upper) of mask mode: the lower one defaults to 1 / upper, as in verl."""
        upper = self.rollout_is_threshold
        lower = self.rollout_is_threshold_lower
        return (1.0 / upper if lower is None else lower), upper


def rollout_is_bounds_problem(lower: float | None, upper: float) -> str | None:
    """Why the thresholds leave mask mode no range; None when lower < upper or unset."""
    if lower is not None and lower >= upper:
        return f"rollout_is_threshold_lower: {lower} must be below rollout_is_threshold ({upper})"
    return None
