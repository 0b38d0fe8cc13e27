"""Qwen3-MoE: Qwen3's attention; the MLP is a router (one row of logits weights per expert,
replicated over TP) and `{expert}` SwiGLU experts, each split over TP like a dense MLP. The
mcore names carry the *global* expert index (megatron's checkpoint key); an expert-parallel
rank holds experts [ep_rank x E / EP, ...) under local indices (`mindrl.checkpoint.online`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from mindrl.families.llama import HEAD, HF_LAYER, MCORE_LAYER
from mindrl.families.qwen3 import EMBEDDING, QWEN3_ATTENTION
from mindrl.families.rules import ParamRule, Split
from mindrl.families.spec import FamilyConfigError, FamilySpec, Features

_MCORE_EXPERT = MCORE_LAYER + "mlp.experts.local_experts.{expert}."
_HF_EXPERT = HF_LAYER + "mlp.experts.{expert}."
EXPERT_MLP = (
    ParamRule(
        MCORE_LAYER + "mlp.router.weight",
        (HF_LAYER + "mlp.gate.weight",),
        (("experts", "hidden"),),
        Split.REPLICATED,
    ),
    ParamRule(
        _MCORE_EXPERT + "linear_fc1.weight",
        (_HF_EXPERT + "gate_proj.weight", _HF_EXPERT + "up_proj.weight"),
        (("moe_ffn", "hidden"), ("moe_ffn", "hidden")),
        Split.GATE_UP,
    ),
    ParamRule(
        _MCORE_EXPERT + "linear_fc2.weight",
        (_HF_EXPERT + "down_proj.weight",),
        (("hidden", "moe_ffn"),),
        Split.ROW,
    ),
)

QWEN3_MOE_RULES: tuple[ParamRule, ...] = (EMBEDDING, *QWEN3_ATTENTION, *EXPERT_MLP, *HEAD)


def _require(cfg: Mapping[str, Any], key: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise FamilyConfigError(f"HF config has no {key!r}")
    return cfg[key]


def moe_fields_from_hf(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`ModelArchConfig`'s MoE fields of a Qwen3-MoE config.json (every layer sparse)."""
    if int(cfg.get("decoder_sparse_step", 1) or 1) != 1 or cfg.get("mlp_only_layers"):
        raise FamilyConfigError(
            "HF config decoder_sparse_step / mlp_only_layers: dense layers among Qwen3-MoE's "
            "expert layers are not built yet (every layer must be sparse)"
        )
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    if experts is None:
        raise FamilyConfigError("HF config has no 'num_experts'")
    return {
        "num_experts": int(experts),
        "moe_ffn_hidden_size": int(_require(cfg, "moe_intermediate_size")),
        "moe_router_topk": int(_require(cfg, "num_experts_per_tok")),
        "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
        "moe_aux_loss_coeff": float(cfg.get("router_aux_loss_coef", 0.0) or 0.0),
    }


class MoEArch(Protocol):
    """The MoE fields of `ModelArchConfig` an export reads."""

    @property
    def num_experts(self) -> int | None: ...

    @property
    def moe_router_topk(self) -> int: ...

    @property
    def expert_ffn_hidden_size(self) -> int: ...

    @property
    def norm_topk_prob(self) -> bool: ...

    @property
    def moe_aux_loss_coeff(self) -> float: ...


def moe_fields_to_hf(arch: MoEArch) -> dict[str, Any]:
    """Qwen3MoeConfig's MoE arguments of `arch`."""
    return {
        "num_experts": arch.num_experts,
        "num_experts_per_tok": arch.moe_router_topk,
        "moe_intermediate_size": arch.expert_ffn_hidden_size,
        "norm_topk_prob": arch.norm_topk_prob,
        "router_aux_loss_coef": arch.moe_aux_loss_coeff,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


QWEN3_MOE = FamilySpec(
    name="qwen3_moe",
    display_name="Qwen3-MoE",
    hf_architecture="Qwen3MoeForCausalLM",
    hf_config_class="Qwen3MoeConfig",
    rules=QWEN3_MOE_RULES,
    features=Features(qk_norm=True, moe=True),
    aliases=("qwen3-moe",),
    arch_fields_from_hf=moe_fields_from_hf,
    hf_fields_from_arch=moe_fields_to_hf,
    tiny_hf_fields={"use_sliding_window": False, "attention_bias": False},
)
