"""The model families mindrl knows, built or not, and how an HF config.json names them (json
only, no torch): shared by config-time family inference (`model_family`) and the converter."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BUILT = ("llama", "qwen2", "qwen3", "qwen3_moe")
QK_NORM_FAMILIES = (
    "qwen3",
    "qwen3_moe",
)  # RMSNorm over each query / key head  # families mindrl builds (one mapping table each)

# Families mindrl knows but cannot build -> what is missing (goes into the refusal line).
NOT_BUILT: dict[str, str] = {
    "qwen2_moe": "mixture of experts",
    "moe": "mixture of experts",
    "mixtral": "mixture of experts",
    "deepseek_v3": "multi-latent attention, mixture of experts",
    "deepseek_v2": "multi-latent attention, mixture of experts",
    "multimodal": "vision encoder",
}

# `model_type_hf` spellings of the families above (MindSpeed-LLM's converter names included).
MODEL_TYPE_HF_ALIASES: dict[str, str] = {
    "qwen3_moe": "qwen3_moe",
    "qwen3-moe": "qwen3_moe",
    "qwen2_moe": "qwen2_moe",
    "qwen2-moe": "qwen2_moe",
    "mixtral": "mixtral",
    "deepseek_v3": "deepseek_v3",
    "deepseekv3": "deepseek_v3",
    "deepseek3": "deepseek_v3",
    "deepseek_v2": "deepseek_v2",
    "deepseek2": "deepseek_v2",
    "qwen2_vl": "multimodal",
    "qwen2vl": "multimodal",
    "qwen25_vl": "multimodal",
    "qwen2_5_vl": "multimodal",
    "qwen25vl": "multimodal",
}

# HF `architectures` class -> family, for a config.json without `model_type`.
HF_ARCHITECTURE_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV2ForCausalLM": "deepseek_v2",
}

# Model-yaml keys that mark a family (MoE keys with qk_layernorm: Qwen3-MoE, built; without it,
# or with MLA / a vision model: families mindrl does not build). Their "off" values are consumed
# here (dropped before `ModelArchConfig` is built), so `qk_layernorm: false` is not an
# "unknown key".
FEATURE_KEYS = ("qk_layernorm", "multi_latent_attention", "mm_model", "attention_bias")
MOE_KEYS = (
    "num_experts",
    "n_shared_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
    "expert_model_parallel_size",
)


def classify_hf_config(cfg: Mapping[str, Any]) -> tuple[str, str]:
    """(family, what mindrl lacks for it) of an HF config.json dict; the reason is '' for the
    families mindrl builds (llama, qwen2, qwen3, qwen3_moe)."""
    model_type = str(cfg.get("model_type") or "")
    archs = [a for a in cfg.get("architectures") or () if isinstance(a, str)]
    if (
        "vision_config" in cfg
        or "_vl" in model_type
        or any(a.endswith("ForConditionalGeneration") for a in archs)
    ):
        return model_type or "multimodal", "multimodal: vision encoder"
    family = model_type or next(
        (HF_ARCHITECTURE_FAMILIES[a] for a in archs if a in HF_ARCHITECTURE_FAMILIES), ""
    )
    if not family:
        return "unknown", "config.json names no model_type or known architectures"
    if family in BUILT:
        return family, ""
    return family, NOT_BUILT.get(family, "no mapping table")
