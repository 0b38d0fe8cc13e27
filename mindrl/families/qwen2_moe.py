"""Qwen2-MoE: Qwen2's attention (q/k/v biases), Qwen3-MoE's routed experts (softmax router,
`norm_topk_prob` optional) and one shared expert in every MoE layer, its output scaled by a
sigmoid gate (one row of weights over the hidden state). megatron-core builds the shared expert
as `SharedExpertMLP` with `moe_shared_expert_gate`: a SwiGLU MLP split over TP like a dense one,
its gate replicated on every TP rank."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from mindrl.families.llama import (
    ATTENTION_OUT,
    EMBEDDING,
    HEAD,
    HF_LAYER,
    INPUT_NORM,
    MCORE_LAYER,
    PRE_MLP_NORM,
    QKV,
)
from mindrl.families.qwen2 import QKV_BIAS
from mindrl.families.qwen3_moe import EXPERT_MLP, MoEArch, moe_fields_from_hf, moe_fields_to_hf
from mindrl.families.rules import ParamRule, Split
from mindrl.families.spec import FamilyConfigError, FamilySpec, Features


def shared_expert_rules(hf_prefix: str) -> tuple[ParamRule, ...]:
    """The shared expert's SwiGLU MLP (HF module `hf_prefix`: Qwen2-MoE's `mlp.shared_expert.`,
    DeepSeek's `mlp.shared_experts.`), present when the architecture has one."""
    hf = HF_LAYER + hf_prefix
    mcore = MCORE_LAYER + "mlp.shared_experts."
    return (
        ParamRule(
            mcore + "linear_fc1.weight",
            (hf + "gate_proj.weight", hf + "up_proj.weight"),
            (("shared_ffn", "hidden"), ("shared_ffn", "hidden")),
            Split.GATE_UP,
            when="shared_expert",
            layers="moe",
        ),
        ParamRule(
            mcore + "linear_fc2.weight",
            (hf + "down_proj.weight",),
            (("hidden", "shared_ffn"),),
            Split.ROW,
            when="shared_expert",
            layers="moe",
        ),
    )


SHARED_EXPERT_GATE = ParamRule(
    MCORE_LAYER + "mlp.shared_experts.gate_weight",
    (HF_LAYER + "mlp.shared_expert_gate.weight",),
    (("one", "hidden"),),
    Split.REPLICATED,
    when="shared_expert_gate",
    layers="moe",
)

QWEN2_MOE_RULES: tuple[ParamRule, ...] = (
    EMBEDDING,
    INPUT_NORM,
    QKV,
    QKV_BIAS,
    ATTENTION_OUT,
    PRE_MLP_NORM,
    *EXPERT_MLP,
    *shared_expert_rules("mlp.shared_expert."),
    SHARED_EXPERT_GATE,
    *HEAD,
)


def qwen2_moe_fields_from_hf(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`ModelArchConfig`'s MoE and shared-expert fields of a Qwen2-MoE config.json."""
    if cfg.get("qkv_bias") is False:
        raise FamilyConfigError("HF config qkv_bias=false: Qwen2-MoE without q/k/v biases")
    fields = moe_fields_from_hf(cfg)
    shared = cfg.get("shared_expert_intermediate_size")
    if shared:
        fields.update(moe_shared_expert_intermediate_size=int(shared), shared_expert_gate=True)
    return fields


class SharedExpertArch(MoEArch, Protocol):
    """The shared-expert fields of `ModelArchConfig` an export reads."""

    @property
    def shared_expert_ffn_hidden_size(self) -> int | None: ...

    @property
    def shared_expert_gate(self) -> bool: ...


def qwen2_moe_fields_to_hf(arch: SharedExpertArch) -> dict[str, Any]:
    """Qwen2MoeConfig's MoE arguments of `arch` (HF's shared expert always has its gate)."""
    shared = getattr(arch, "shared_expert_ffn_hidden_size", None)
    if shared is not None and not getattr(arch, "shared_expert_gate", True):
        raise FamilyConfigError(
            "a Qwen2-MoE shared expert without its gate (shared_expert_gate: false) has no HF "
            "Qwen2MoeForCausalLM equivalent"
        )
    if shared is None:
        raise FamilyConfigError(
            "Qwen2-MoE needs its shared expert (moe_shared_expert_intermediate_size)"
        )
    return {**moe_fields_to_hf(arch), "shared_expert_intermediate_size": shared, "qkv_bias": True}


QWEN2_MOE = FamilySpec(
    name="qwen2_moe",
    display_name="Qwen2-MoE",
    hf_architecture="Qwen2MoeForCausalLM",
    hf_config_class="Qwen2MoeConfig",
    rules=QWEN2_MOE_RULES,
    features=Features(qkv_bias=True, moe=True),
    aliases=("qwen2-moe",),
    arch_fields_from_hf=qwen2_moe_fields_from_hf,
    hf_fields_from_arch=qwen2_moe_fields_to_hf,
    tiny_hf_fields={"use_sliding_window": False},
)
