"""Sequence packing's cross-field rules (`use_remove_padding` / `use_dynamic_bsz`).

Packing covers the actor's passes and the reference's (MindSpeed-RL's remove-padding covers
its critic too; mindrl's critic stays padded, said once). Budgeted micro-batches of varying
row counts cannot cross a pipeline unpacked (its buffers have one shape), and the virtual
pipeline's interleaved schedule is not built for a varying micro-batch count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mindrl.config.fates import warn_once

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig


def packing_problems(run: RunConfig) -> list[str]:
    cfg = run.rl.micro_batching
    out = shared_prompt_problems(run)
    if not (cfg.use_remove_padding or cfg.use_dynamic_bsz):
        return out
    roles = [r for r in (run.actor, run.ref) if r is not None]
    if cfg.use_dynamic_bsz:
        for role in roles:
            if role.pp > 1 and not cfg.use_remove_padding:
                out.append(
                    f"rl_config.use_dynamic_bsz: the {role.role}'s pipeline "
                    f"(pipeline_model_parallel_size={role.pp}) sends one micro-batch shape; "
                    "set use_remove_padding: true with it"
                )
            if role.parallel.num_layers_per_virtual_pipeline_stage:
                out.append(
                    f"rl_config.use_dynamic_bsz with the {role.role}'s virtual pipeline "
                    "(num_layers_per_virtual_pipeline_stage) is not built yet"
                )
    if run.critic is not None:
        warn_once(
            "packing.critic",
            "rl_config.use_remove_padding / use_dynamic_bsz: the critic's passes stay padded "
            "(packing covers the actor and the reference)",
        )
    return out


def shared_prompt_problems(run: RunConfig) -> list[str]:
    """`share_prompt_forward` packs a prompt's rows into one block: it needs the packed layout,
    and its attention mask is built for megatron's local attention (the CPU path)."""
    cfg = run.rl.micro_batching
    if not cfg.share_prompt_forward:
        return []
    if not cfg.use_remove_padding:
        return [
            "rl_config.share_prompt_forward packs a prompt's samples together: set "
            "use_remove_padding: true with it"
        ]
    if run.runtime.accelerator in ("npu", "cuda"):
        return [
            f"rl_config.share_prompt_forward on {run.runtime.accelerator}: its attention "
            "mask is built for megatron's local attention (CPU); Transformer Engine's / "
            "MindSpeed's fused attention would need it as an arbitrary mask (not built)"
        ]
    split = [r for r in (run.actor, run.ref) if r is not None and r.cp > 1]
    if split:
        return [
            f"rl_config.share_prompt_forward with {split[0].role}_config's "
            f"context_parallel_size {split[0].cp}: a prompt block's mask over CP-split "
            "chunks is not built; turn one of them off"
        ]
    return []
