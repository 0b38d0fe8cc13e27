"""LoRA's cross-field rules, as MindSpeed-RL's GRPO-LoRA configures it.

Adapters train on the actor only (`megatron_training.lora_*` reaches every role's section;
the reference and a reward model are frozen, so their copies are unread). `share_backbone`
makes the reference the actor's base model with its adapters off, which needs a reference
on the actor's devices and a LoRA actor, and is refused under ray_dapo (no reference), as
MindSpeed-RL does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindrl.config.fates import warn_once
from mindrl.config.megatron_features import LORA_TARGETS

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig


def lora_problems(run: RunConfig) -> list[str]:
    actor, res, out = run.actor, run.rl.resources, []
    lora = actor.lora
    unknown = [t for t in lora.targets if t not in LORA_TARGETS]
    if unknown:
        out.append(
            f"lora_target_modules: {unknown} are not megatron linears mindrl adapts; "
            f"choose from {list(LORA_TARGETS)}"
        )
    if lora.enabled and actor.model.num_experts:
        out.append("lora_target_modules: LoRA on mixture-of-experts models is not built yet")
    if lora.enabled and run.critic is not None:
        out.append("lora_target_modules: LoRA with a critic (stage ray_ppo) is not built yet")
    if res.share_backbone:
        if not lora.enabled:
            out.append(
                "rl_config.share_backbone: the shared backbone can only be used with LoRA "
                "(set lora_target_modules)"
            )
        if actor.data.stage == "ray_dapo":
            out.append("rl_config.share_backbone: cannot be true with stage ray_dapo")
        if not res.use_integrated_worker:
            out.append(
                "rl_config.share_backbone: the reference runs in the actor's processes; "
                "it needs use_integrated_worker: true (no ref_config / reference_resource)"
            )
    if not lora.enabled and lora.lora_ckpt_filter:
        warn_once(
            "lora.ckpt_filter",
            "lora_ckpt_filter: no effect without lora_target_modules (no adapters to filter)",
        )
    if lora.enabled and run.reward is not None and run.reward.lora.enabled:
        warn_once(
            "lora.reward",
            "lora_target_modules: no effect on the reward model (frozen; adapters train on "
            "the actor only)",
        )
    return out
