"""Megatron / MindSpeed model and parallelism keys of features mindrl has not built.

MindSpeed-RL model and training YAMLs carry them (DeepSeek's MoE variants, MLA, YaRN RoPE
scaling, custom layer specs). Each is accepted at its MindSpeed-RL default and refused with the missing
feature's name otherwise, so such a YAML fails at config time instead of training a different
model. (Qwen3's `qk_layernorm`, llama3 RoPE scaling and Qwen3-MoE's experts are built: they
are `ModelArchConfig` fields; `expert_model_parallel_size` is honoured here.)
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fates import MINDSPEED, handed, no_effect, refused
from mindrl.config.fields import spec

# The seed-era MoE key whose meaning mindrl reads from moe_router_load_balancing_type.
SEQ_AUX = refused("seed-era seq_aux: set moe_router_load_balancing_type: seq_aux_loss instead")


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts keys beyond the architecture ones (`num_experts`, `moe_router_topk`,
    `moe_ffn_hidden_size`, `norm_topk_prob`, the routing variants, the shared experts, the
    dense layers, the balance losses and the dispatcher live in `ModelArchConfig`): expert
    parallelism and NPU kernels."""

    expert_model_parallel_size: int = spec(
        1, ge=1, help="experts split over this many ranks (megatron's expert parallel group)"
    )
    moe_tp_extend_ep: bool = spec(
        False,
        fate=no_effect(
            "MindSpeed's expert layout over TP x EP; mindrl splits each expert over TP inside "
            "its EP rank (megatron's expert_tensor_parallel_size = TP): the same model"
        ),
    )
    seq_aux: bool = spec(False, fate=SEQ_AUX)
    moe_grouped_gemm: bool = spec(
        False,
        fate=handed(MINDSPEED),
        help="grouped expert GEMM kernels (NPU); elsewhere mindrl builds megatron's "
        "SequentialMLP (one GEMM per expert, the same numerics)",
    )
    moe_permutation_async_comm: bool = spec(False, fate=handed(MINDSPEED))
    moe_alltoall_overlap_comm: bool = spec(False, fate=handed(MINDSPEED))
    use_fused_moe_token_permute_and_unpermute: bool = spec(False, fate=handed(MINDSPEED))


LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters (MindSpeed-LLM's LoRA keys; `mindrl/models/lora.py`): on when
    `lora_target_modules` names megatron linears. Rules: `config/lora.py`."""

    lora_target_modules: tuple[str, ...] | str | None = spec(
        None, help=f"megatron linears that get adapters, of {', '.join(LORA_TARGETS)}"
    )
    lora_r: int = spec(8, ge=1, help="adapter rank")
    lora_alpha: float = spec(16, help="adapter scale numerator: the update is alpha / r * B A")
    lora_fusion: bool = spec(
        False,
        fate=no_effect(
            "CCLoRA overlaps the adapters' TP communication with compute on NPU; the "
            "adapters compute the same without it"
        ),
    )
    lora_ckpt_filter: bool = spec(
        False,
        help="step checkpoints hold the adapters only; resume reloads the base from load",
    )
    pretrained_checkpoint: str | None = spec(
        None,
        fate=refused(
            "LoRA's base weights (pretrained_checkpoint): not built yet; give them as load"
        ),
    )

    @property
    def targets(self) -> tuple[str, ...]:
        value = self.lora_target_modules
        if not value:
            return ()
        return (value,) if isinstance(value, str) else tuple(value)

    @property
    def enabled(self) -> bool:
        return bool(self.targets)

    @property
    def scale(self) -> float:
        return self.lora_alpha / self.lora_r


@dataclass(frozen=True)
class LayerVariantConfig:
    """Layer-level variants of the GPT block beyond Llama / Qwen2 / Qwen3."""

    attention_bias: bool = spec(
        False,
        fate=refused(
            "a bias on every attention projection: not built yet; mindrl builds q/k/v biases "
            "(add_qkv_bias)"
        ),
    )
    mm_model: str | None = spec(None, fate=refused("multimodal models: not built yet"))
    attention_mask_type: str = spec(
        "causal",
        help="general (MindSpeed-LLM's full mask built from each batch, as its DPO configs "
        "set) is the same causal attention over each row's own tokens here",
        fate=refused("only causal attention is built", allowed=("causal", "general")),
    )
    use_rotary_position_embeddings: bool = spec(
        True, fate=no_effect("mindrl always applies RoPE (position_embedding_type: rope)")
    )
    transformer_impl: str = spec(
        "local",
        fate=no_effect(
            "mindrl uses Transformer Engine's layer spec when transformer_engine is installed, "
            "megatron-core's local spec otherwise"
        ),
    )
    use_deter_comp: bool = spec(False, fate=handed(MINDSPEED), help="seed-era npu_deterministic")
    # last: from here on `spec` in this class body names the field, not the function
    spec: tuple[str, ...] | str | None = spec(
        None,
        fate=refused(
            "custom layer specs: not built yet (MindSpeed-LLM's qwen3_spec / deepseek_spec are read "
            "as their model family); mindrl builds megatron-core's GPT layer spec"
        ),
    )
