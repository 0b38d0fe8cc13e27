"""Config overrides tests share to pin a layout the shipped configs no longer default to."""

from __future__ import annotations

# MindSpeed-RL's defaults for what the tiny CPU configs ship fast (configs/grpo_tiny_cpu.yaml):
# padded micro-batches of micro_batch_size rows, each sample running its prompt, the old
# log-probs by a pass of their own. For tests of that layout, or of turning one of these on.
PADDED_LAYOUT = (
    "rl_config.use_remove_padding=false",
    "rl_config.use_dynamic_bsz=false",
    "rl_config.share_prompt_forward=false",
    "rl_config.recompute_old_log_prob=auto",
)
