"""The DPO loss knobs (MindSpeed-LLM's names under `megatron_training`): one definition of their
defaults and ranges.

Torch-free, like `loss_config`, so config reading can build it without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mindrl.algorithms.loss_config import broken_rule, knob
from mindrl.algorithms.names import DPO_LOSS_TYPES


@dataclass(frozen=True)
class DPOLossConfig:
    """`dpo_beta` is the temperature on the policy / reference log-ratio (IPO's tau);
    `dpo_label_smoothing` is cDPO's probability that a pair's label is flipped (sigmoid only);
    `pref_ftx` weighs an SFT term, the chosen response's mean token NLL, added to each pair's
    loss."""

    dpo_beta: float = knob(0.1, gt=0.0, help="temperature on the policy/reference log-ratio")
    dpo_loss_type: str = knob("sigmoid", choices=DPO_LOSS_TYPES)
    dpo_label_smoothing: float = knob(
        0.0, ge=0.0, le=0.5, help="cDPO: the chance a pair's preference label is wrong"
    )
    pref_ftx: float = knob(0.0, ge=0.0, help="weight of the chosen responses' SFT loss")

    def __post_init__(self) -> None:
        for f in fields(DPOLossConfig):
            problem = broken_rule(f.name, getattr(self, f.name), f.metadata)
            if problem is not None:
                raise ValueError(problem)
        if self.dpo_label_smoothing > 0 and self.dpo_loss_type != "sigmoid":
            raise ValueError(
                f"dpo_label_smoothing applies to dpo_loss_type sigmoid only (cDPO), "
                f"not {self.dpo_loss_type!r}"
            )
