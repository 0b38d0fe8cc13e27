"""MindSpeed-LLM's DPO keys under `megatron_training` (stage dpo): one role-config group, its
own module so the role config can hold it without importing the stage's rules
(`mindrl.config.dpo`)."""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.algorithms.dpo_config import DPOLossConfig
from mindrl.algorithms.names import DPO_LOSS_TYPES
from mindrl.config.fates import honoured, no_effect
from mindrl.config.fields import spec

DPO = "dpo"  # megatron_training.stage of offline DPO


@dataclass(frozen=True)
class DPOKeys:
    """MindSpeed-LLM's DPO keys (megatron_training), read with stage dpo."""

    dpo_beta: float = spec(0.1, gt=0.0, help="temperature on the policy / reference log-ratio")
    dpo_loss_type: str = spec(
        "sigmoid",
        choices=DPO_LOSS_TYPES,
        help="sigmoid (DPO), hinge (SLiC), ipo (IPO on length-averaged log-probs)",
    )
    dpo_label_smoothing: float = spec(
        0.0, ge=0.0, le=0.5, help="cDPO: the chance a pair's label is flipped (sigmoid)"
    )
    pref_ftx: float = spec(0.0, ge=0.0, help="weight of the chosen answers' SFT loss")
    ref_model: str = spec(
        "",
        help="the reference's checkpoint (empty: the policy's load)",
        fate=honoured(via="RunConfig.ref"),  # the reference role, loaded from it
    )
    refer_model_iter: int = spec(
        1,
        fate=no_effect(
            "the reference loads ref_model's latest checkpoint (or its HF folder), as the "
            "policy loads load"
        ),
    )

    def loss_config(self) -> DPOLossConfig:
        return DPOLossConfig(
            dpo_beta=self.dpo_beta,
            dpo_loss_type=self.dpo_loss_type,
            dpo_label_smoothing=self.dpo_label_smoothing,
            pref_ftx=self.pref_ftx,
        )
