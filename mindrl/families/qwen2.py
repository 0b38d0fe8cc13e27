"""Qwen2 / Qwen2.5: Llama with biases on q, k and v."""

from __future__ import annotations

from mindrl.families.llama import HF_LAYER, LLAMA_RULES, MCORE_LAYER
from mindrl.families.rules import ParamRule, Split
from mindrl.families.spec import FamilySpec, Features

QKV_BIAS = ParamRule(
    MCORE_LAYER + "self_attention.linear_qkv.bias",
    (
        HF_LAYER + "self_attn.q_proj.bias",
        HF_LAYER + "self_attn.k_proj.bias",
        HF_LAYER + "self_attn.v_proj.bias",
    ),
    (("q",), ("kv",), ("kv",)),
    Split.QKV,
    when="qkv_bias",
)

QWEN2_RULES: tuple[ParamRule, ...] = (*LLAMA_RULES, QKV_BIAS)

QWEN2 = FamilySpec(
    name="qwen2",
    display_name="Qwen2",
    hf_architecture="Qwen2ForCausalLM",
    hf_config_class="Qwen2Config",
    rules=QWEN2_RULES,
    features=Features(qkv_bias=True),
    variants=("qwen25",),
    tiny_hf_fields={"use_sliding_window": False},
)
