"""The routed experts of Qwen3-MoE, Qwen2-MoE and DeepSeek-V3 as megatron-core's MoE layer: the
TransformerConfig fields.

Routing: Qwen3-MoE takes the softmax over all experts, keeps the top k and, with
`norm_topk_prob`, renormalises them to sum to 1, which equals megatron's softmax over the top-k
logits (`moe_router_pre_softmax=False`); without it, megatron's top-k of the full softmax
(`moe_router_pre_softmax=True`). Experts are megatron's SequentialMLP (one GEMM per expert,
`moe_grouped_gemm=False`: no grouped-GEMM kernel on CPU), each split over TP inside its expert
parallel rank; tokens travel between EP ranks by the alltoall dispatcher (gloo on CPU has
`all_to_all_single`).

DeepSeek-V3 routes by sigmoid scores plus a per-expert bias (the bias only picks the experts),
optionally within the best groups of experts, and scales the renormalised probabilities;
Qwen2-MoE and DeepSeek-V3 add a shared expert (`moe_shared_expert_intermediate_size`;
Qwen2-MoE's with a sigmoid gate); DeepSeek's first layers are dense (`moe_layer_freq` as a
per-layer list).
"""

from __future__ import annotations

from typing import Any

from mindrl.config.model_arch import MOE_DISPATCHERS, ModelArchConfig


def validate_expert_layout(arch: ModelArchConfig, ep: int) -> list[str]:
    """What stops `ep` ranks from splitting this model's experts (one line each)."""
    if not arch.is_moe:
        return [] if ep == 1 else [f"expert_model_parallel_size {ep} needs a MoE model"]
    if arch.num_experts % ep:  # type: ignore[operator]
        return [
            f"--target-expert-parallel-size {ep} does not divide num_experts={arch.num_experts} "
            "(expert_model_parallel_size must divide it)"
        ]
    return []


def moe_transformer_kwargs(arch: ModelArchConfig, expert_parallel_size: int) -> dict[str, Any]:
    """TransformerConfig fields of the MoE layer ({} for a dense model)."""
    if not arch.is_moe:
        return {}
    balance = arch.moe_router_load_balancing_type
    return dict(
        num_moe_experts=arch.num_experts,
        moe_ffn_hidden_size=arch.expert_ffn_hidden_size,
        moe_router_topk=arch.moe_router_topk,
        moe_router_pre_softmax=not arch.norm_topk_prob,
        moe_router_score_function=arch.moe_router_score_function,
        moe_router_enable_expert_bias=arch.moe_router_enable_expert_bias,
        moe_router_num_groups=arch.moe_router_num_groups,
        moe_router_group_topk=arch.moe_router_group_topk,
        moe_router_topk_scaling_factor=arch.moe_router_topk_scaling_factor,
        moe_shared_expert_intermediate_size=arch.shared_expert_ffn_hidden_size,
        moe_shared_expert_gate=arch.shared_expert_gate,
        moe_shared_expert_overlap=False,
        moe_layer_freq=[int(moe) for moe in arch.moe_layer_pattern],
        moe_router_load_balancing_type=balance,
        moe_aux_loss_coeff=arch.moe_aux_loss_coeff if balance != "none" else 0.0,
        moe_z_loss_coeff=arch.moe_z_loss_coeff,
        moe_token_dispatcher_type=MOE_DISPATCHERS[arch.moe_token_dispatcher_type],
        moe_grouped_gemm=False,
        moe_router_dtype="fp32",
        expert_model_parallel_size=expert_parallel_size,
        moe_permute_fusion=False,
        moe_router_fusion=False,
    )
