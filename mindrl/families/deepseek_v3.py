"""DeepSeek-V3: multi-latent attention (MLA), sigmoid routing with an expert bias over groups of
experts, shared experts, and dense MLPs in the first `first_k_dense_replace` layers.

megatron-core's local MLA spec names the latent projections `linear_q_down_proj` (HF `q_a_proj`),
`linear_q_up_proj` (`q_b_proj`; `linear_q_proj` = `q_proj` without a q latent),
`linear_kv_down_proj` (`kv_a_proj_with_mqa`: the kv latent and the shared RoPE key) and
`linear_kv_up_proj` (`kv_b_proj`); each is a column-parallel linear, the down projections'
outputs gathered over TP before their norms (`q_layernorm` / `kv_layernorm`, HF's
`q_a_layernorm` / `kv_a_layernorm`). Head rows are laid out [no-RoPE, RoPE] (q) and
[no-RoPE key, value] (kv) per head, as in HF, so every split is a plain row split. megatron
applies RoPE to DeepSeek's interleaved RoPE dims as HF does with `rope_interleave` (the
default), so the weights map unchanged.

The router's `e_score_correction_bias` is megatron's `expert_bias` buffer. A DeepSeek-V3
checkpoint's multi-token-prediction layers (`model.layers.{num_hidden_layers + i}`) are not
part of the causal LM: the converter and the online loader drop them by name with a notice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

from mindrl.families.llama import (
    DENSE_MLP,
    EMBEDDING,
    HEAD,
    HF_LAYER,
    INPUT_NORM,
    MCORE_LAYER,
    PRE_MLP_NORM,
)
from mindrl.families.qwen2_moe import shared_expert_rules
from mindrl.families.qwen3_moe import EXPERT_MLP
from mindrl.families.rules import ParamRule, Split
from mindrl.families.spec import FamilyConfigError, FamilySpec, Features

_ATTN = MCORE_LAYER + "self_attention."
_HF_ATTN = HF_LAYER + "self_attn."

MLA = (
    ParamRule(
        _ATTN + "linear_q_down_proj.weight",
        (_HF_ATTN + "q_a_proj.weight",),
        (("q_lora", "hidden"),),
        Split.COLUMN,
        when="q_lora",
    ),
    ParamRule(
        _ATTN + "q_layernorm.weight",
        (_HF_ATTN + "q_a_layernorm.weight",),
        (("q_lora",),),
        Split.REPLICATED,
        when="q_lora",
    ),
    ParamRule(
        _ATTN + "linear_q_up_proj.weight",
        (_HF_ATTN + "q_b_proj.weight",),
        (("q_up", "q_lora"),),
        Split.COLUMN,
        when="q_lora",
    ),
    ParamRule(
        _ATTN + "linear_q_proj.weight",
        (_HF_ATTN + "q_proj.weight",),
        (("q_up", "hidden"),),
        Split.COLUMN,
        when="q_direct",
    ),
    ParamRule(
        _ATTN + "linear_kv_down_proj.weight",
        (_HF_ATTN + "kv_a_proj_with_mqa.weight",),
        (("kv_down", "hidden"),),
        Split.COLUMN,
    ),
    ParamRule(
        _ATTN + "kv_layernorm.weight",
        (_HF_ATTN + "kv_a_layernorm.weight",),
        (("kv_lora",),),
        Split.REPLICATED,
    ),
    ParamRule(
        _ATTN + "linear_kv_up_proj.weight",
        (_HF_ATTN + "kv_b_proj.weight",),
        (("kv_up", "kv_lora"),),
        Split.COLUMN,
    ),
    ParamRule(
        _ATTN + "linear_proj.weight",
        (_HF_ATTN + "o_proj.weight",),
        (("hidden", "v_out"),),
        Split.ROW,
    ),
)

EXPERT_BIAS = ParamRule(
    MCORE_LAYER + "mlp.router.expert_bias",
    (HF_LAYER + "mlp.gate.e_score_correction_bias",),
    (("experts",),),
    Split.REPLICATED,
    when="expert_bias",
    layers="moe",
)


def _moe_layers_only(rules: tuple[ParamRule, ...]) -> tuple[ParamRule, ...]:
    return tuple(ParamRule(**{**r.__dict__, "layers": "moe"}) for r in rules)


def _dense_layers_only(rules: tuple[ParamRule, ...]) -> tuple[ParamRule, ...]:
    return tuple(ParamRule(**{**r.__dict__, "layers": "dense"}) for r in rules)


DEEPSEEK_V3_RULES: tuple[ParamRule, ...] = (
    EMBEDDING,
    INPUT_NORM,
    *MLA,
    PRE_MLP_NORM,
    *_dense_layers_only(DENSE_MLP),
    *_moe_layers_only(EXPERT_MLP),
    EXPERT_BIAS,
    *shared_expert_rules("mlp.shared_experts."),
    *HEAD,
)

_MTP_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def mtp_tensor_names(names: list[str], num_hidden_layers: int) -> list[str]:
    """The tensors of a DeepSeek checkpoint's multi-token-prediction layers (layer indices at
    or past `num_hidden_layers`): not part of the causal LM mindrl trains."""
    return [n for n in names if (m := _MTP_LAYER.match(n)) and int(m.group(1)) >= num_hidden_layers]


def _int(cfg: Mapping[str, Any], key: str) -> int:
    if cfg.get(key) is None:
        raise FamilyConfigError(f"HF config has no {key!r}")
    return int(cfg[key])


def deepseek_fields_from_hf(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`ModelArchConfig`'s MLA and MoE fields of a DeepSeek-V3 config.json."""
    if cfg.get("rope_interleave") is False:
        raise FamilyConfigError(
            "HF config rope_interleave=false: megatron-core's MLA rotates DeepSeek's "
            "interleaved RoPE dims only"
        )
    if cfg.get("norm_topk_prob") is False:
        raise FamilyConfigError(
            "HF config norm_topk_prob=false: megatron-core's sigmoid routing always "
            "renormalises the top-k probabilities"
        )
    topk = _int(cfg, "num_experts_per_tok")
    groups = int(cfg.get("n_group") or 1)
    group_topk = int(cfg.get("topk_group") or 1)
    if groups > 1 and topk // group_topk != 2:
        raise FamilyConfigError(
            f"HF config n_group={groups}, topk_group={group_topk}, num_experts_per_tok={topk}: "
            "HF scores a group by its top 2 experts, megatron-core by its top "
            "num_experts_per_tok / topk_group; they agree only when that is 2"
        )
    q_lora = cfg.get("q_lora_rank")
    return {
        "multi_latent_attention": True,
        "q_lora_rank": int(q_lora) if q_lora else None,
        "kv_lora_rank": _int(cfg, "kv_lora_rank"),
        "qk_head_dim": _int(cfg, "qk_nope_head_dim"),
        "qk_pos_emb_head_dim": _int(cfg, "qk_rope_head_dim"),
        "v_head_dim": _int(cfg, "v_head_dim"),
        "num_experts": _int(cfg, "n_routed_experts"),
        "moe_ffn_hidden_size": _int(cfg, "moe_intermediate_size"),
        "moe_router_topk": topk,
        "norm_topk_prob": True,
        "n_shared_experts": int(cfg.get("n_shared_experts") or 0) or None,
        "first_k_dense_replace": int(cfg.get("first_k_dense_replace") or 0),
        "moe_router_score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "moe_router_num_groups": groups if groups > 1 else None,
        "moe_router_group_topk": group_topk if groups > 1 else None,
        "moe_router_topk_scaling_factor": float(cfg.get("routed_scaling_factor") or 1.0),
        "moe_router_load_balancing_type": "none",
    }


class DeepSeekArch(Protocol):
    """The fields of `ModelArchConfig` a DeepSeek-V3 export reads."""

    @property
    def q_lora_rank(self) -> int | None: ...
    @property
    def kv_lora_rank(self) -> int | None: ...
    @property
    def qk_head_dim(self) -> int | None: ...
    @property
    def qk_pos_emb_head_dim(self) -> int | None: ...
    @property
    def v_head_dim(self) -> int | None: ...
    @property
    def num_experts(self) -> int | None: ...
    @property
    def expert_ffn_hidden_size(self) -> int: ...
    @property
    def moe_router_topk(self) -> int: ...
    @property
    def shared_expert_ffn_hidden_size(self) -> int | None: ...
    @property
    def first_k_dense_replace(self) -> int | None: ...
    @property
    def moe_layer_freq(self) -> int | None: ...
    @property
    def moe_router_num_groups(self) -> int | None: ...
    @property
    def moe_router_group_topk(self) -> int | None: ...
    @property
    def moe_router_topk_scaling_factor(self) -> float | None: ...
    @property
    def moe_router_score_function(self) -> str: ...
    @property
    def moe_router_enable_expert_bias(self) -> bool: ...


def deepseek_fields_to_hf(arch: DeepSeekArch) -> dict[str, Any]:
    """DeepseekV3Config's MLA and MoE arguments of `arch` (no multi-token-prediction layers)."""
    problems = []
    if (arch.moe_layer_freq or 1) != 1:
        problems.append("moe_layer_freq other than 1")
    if arch.moe_router_score_function != "sigmoid" or not arch.moe_router_enable_expert_bias:
        problems.append("routing other than sigmoid with an expert bias")
    shared = arch.shared_expert_ffn_hidden_size or 0
    if shared % arch.expert_ffn_hidden_size:
        problems.append(f"a shared expert of {shared} (not n x moe_ffn_hidden_size)")
    if problems:
        raise FamilyConfigError(
            f"a DeepSeek-V3 model with {', '.join(problems)} has no HF DeepseekV3ForCausalLM "
            "equivalent"
        )
    return {
        "q_lora_rank": arch.q_lora_rank,
        "kv_lora_rank": arch.kv_lora_rank,
        "qk_nope_head_dim": arch.qk_head_dim,
        "qk_rope_head_dim": arch.qk_pos_emb_head_dim,
        "head_dim": arch.qk_pos_emb_head_dim,  # transformers' rotary width, not hidden / heads
        "v_head_dim": arch.v_head_dim,
        "n_routed_experts": arch.num_experts,
        "moe_intermediate_size": arch.expert_ffn_hidden_size,
        "num_experts_per_tok": arch.moe_router_topk,
        "n_shared_experts": shared // arch.expert_ffn_hidden_size,
        "first_k_dense_replace": arch.first_k_dense_replace or 0,
        "n_group": arch.moe_router_num_groups or 1,
        "topk_group": arch.moe_router_group_topk or 1,
        "routed_scaling_factor": arch.moe_router_topk_scaling_factor or 1.0,
        "norm_topk_prob": True,
        # what DeepSeek-V3's own config.json says and vLLM reads (transformers' class assumes
        # them): without them vLLM routes by softmax and has no expert bias to load
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "rope_interleave": True,
        "num_nextn_predict_layers": 0,
    }


DEEPSEEK_V3 = FamilySpec(
    name="deepseek_v3",
    display_name="DeepSeek-V3",
    hf_architecture="DeepseekV3ForCausalLM",
    hf_config_class="DeepseekV3Config",
    rules=DEEPSEEK_V3_RULES,
    features=Features(qk_norm=True, moe=True, mla=True),
    aliases=("deepseekv3", "deepseek3"),
    layer_spec_hint="deepseek",
    yaml_marker="multi_latent_attention",
    arch_fields_from_hf=deepseek_fields_from_hf,
    dropped_hf_tensors=mtp_tensor_names,
    hf_fields_from_arch=deepseek_fields_to_hf,
    tiny_hf_fields={"attention_bias": False},
)
