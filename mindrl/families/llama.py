"""Llama (Llama 2, Llama 3.x; Llama 3.1's RoPE scaling is a RoPE feature any family may carry,
read by `mindrl.models.hf_arch`): the base layout the Qwen families extend."""

from __future__ import annotations

from mindrl.families.rules import ParamRule, Split
from mindrl.families.spec import FamilySpec

HF_LAYER = "model.layers.{layer}."
MCORE_LAYER = "decoder.layers.{layer}."

EMBEDDING = ParamRule(
    "embedding.word_embeddings.weight",
    ("model.embed_tokens.weight",),
    (("vocab", "hidden"),),
    Split.VOCAB,
)
INPUT_NORM = ParamRule(
    MCORE_LAYER + "input_layernorm.weight",
    (HF_LAYER + "input_layernorm.weight",),
    (("hidden",),),
    Split.REPLICATED,
)
QKV = ParamRule(
    MCORE_LAYER + "self_attention.linear_qkv.weight",
    (
        HF_LAYER + "self_attn.q_proj.weight",
        HF_LAYER + "self_attn.k_proj.weight",
        HF_LAYER + "self_attn.v_proj.weight",
    ),
    (("q", "hidden"), ("kv", "hidden"), ("kv", "hidden")),
    Split.QKV,
)
ATTENTION_OUT = ParamRule(
    MCORE_LAYER + "self_attention.linear_proj.weight",
    (HF_LAYER + "self_attn.o_proj.weight",),
    (("hidden", "q"),),
    Split.ROW,
)
PRE_MLP_NORM = ParamRule(
    MCORE_LAYER + "pre_mlp_layernorm.weight",
    (HF_LAYER + "post_attention_layernorm.weight",),
    (("hidden",),),
    Split.REPLICATED,
)
DENSE_MLP = (
    ParamRule(
        MCORE_LAYER + "mlp.linear_fc1.weight",
        (HF_LAYER + "mlp.gate_proj.weight", HF_LAYER + "mlp.up_proj.weight"),
        (("ffn", "hidden"), ("ffn", "hidden")),
        Split.GATE_UP,
    ),
    ParamRule(
        MCORE_LAYER + "mlp.linear_fc2.weight",
        (HF_LAYER + "mlp.down_proj.weight",),
        (("hidden", "ffn"),),
        Split.ROW,
    ),
)
HEAD = (
    ParamRule(
        "decoder.final_layernorm.weight",
        ("model.norm.weight",),
        (("hidden",),),
        Split.REPLICATED,
    ),
    ParamRule(
        "output_layer.weight",
        ("lm_head.weight",),
        (("vocab", "hidden"),),
        Split.VOCAB,
        when="untied",
    ),
    # Tied embeddings with PP > 1: the last stage holds its own copy of the embedding.
    ParamRule(
        "output_layer.weight",
        ("model.embed_tokens.weight",),
        (("vocab", "hidden"),),
        Split.VOCAB,
        when="tied",
        load_only=True,
    ),
)

LLAMA_RULES: tuple[ParamRule, ...] = (
    EMBEDDING,
    INPUT_NORM,
    QKV,
    ATTENTION_OUT,
    PRE_MLP_NORM,
    *DENSE_MLP,
    *HEAD,
)

LLAMA = FamilySpec(
    name="llama",
    display_name="Llama",
    hf_architecture="LlamaForCausalLM",
    hf_config_class="LlamaConfig",
    rules=LLAMA_RULES,
    variants=("llama2", "llama3"),
    qkv_bias_variant="qwen2",
    tiny_hf_fields={"attention_bias": False, "mlp_bias": False},
)
