"""Qwen3 (dense): Llama plus an RMSNorm over each query / key head (one weight of head_dim,
shared by every head, so every TP rank holds all of it), placed after the QKV projection."""

from __future__ import annotations

from mindrl.families.llama import (
    ATTENTION_OUT,
    DENSE_MLP,
    EMBEDDING,
    HEAD,
    HF_LAYER,
    INPUT_NORM,
    MCORE_LAYER,
    PRE_MLP_NORM,
    QKV,
)
from mindrl.families.rules import ParamRule, Split
from mindrl.families.spec import FamilySpec, Features

QK_NORMS = (
    ParamRule(
        MCORE_LAYER + "self_attention.q_layernorm.weight",
        (HF_LAYER + "self_attn.q_norm.weight",),
        (("head",),),
        Split.REPLICATED,
    ),
    ParamRule(
        MCORE_LAYER + "self_attention.k_layernorm.weight",
        (HF_LAYER + "self_attn.k_norm.weight",),
        (("head",),),
        Split.REPLICATED,
    ),
)
QWEN3_ATTENTION = (INPUT_NORM, QKV, *QK_NORMS, ATTENTION_OUT, PRE_MLP_NORM)

QWEN3_RULES: tuple[ParamRule, ...] = (EMBEDDING, *QWEN3_ATTENTION, *DENSE_MLP, *HEAD)

QWEN3 = FamilySpec(
    name="qwen3",
    display_name="Qwen3",
    hf_architecture="Qwen3ForCausalLM",
    hf_config_class="Qwen3Config",
    rules=QWEN3_RULES,
    features=Features(qk_norm=True),
    layer_spec_hint="qwen3",
    tiny_hf_fields={"use_sliding_window": False, "attention_bias": False},
)
