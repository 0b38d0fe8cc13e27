"""Model architecture: what `configs/model/*.yaml` describes (MindSpeed-RL key names)."""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fates import no_effect, refused
from mindrl.config.fields import spec
from mindrl.config.layer_layout import parse_index_list
from mindrl.families import registry
from mindrl.families.llama import LLAMA

# Token dispatchers megatron-core builds; MindSpeed's alltoall_seq is its alltoall.
MOE_DISPATCHERS = {"alltoall": "alltoall", "alltoall_seq": "alltoall", "allgather": "allgather"}

# RoPE scaling types megatron-core's rotary embeddings build: llama 3.x frequency scaling, and
# YaRN (only with multi-latent attention: megatron's MLA is where its YaRN embedding is wired).
ROPE_SCALING_BUILT = ("llama3", "yarn")
# The llama3 parameters a model file must give with rope_scaling_type: llama3.
LLAMA3_ROPE_KEYS = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# The yarn parameters at their defaults (MindSpeed's): anything else needs rope_scaling_type: yarn.
YARN_DEFAULTS = {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "rope_scaling_mscale": 1.0,
    "rope_scaling_mscale_all_dim": 0.0,
    "rope_scaling_original_max_position_embeddings": None,
}


@dataclass(frozen=True)
class ModelArchConfig:
    """A decoder-only transformer as megatron-core builds it (the families of
    `mindrl.families`: Llama / Qwen2 / Qwen3 / Qwen3-MoE and any registered at run time).
    `num_experts` set: every layer's MLP is a top-k routed mixture of experts."""

    num_layers: int = spec(help="transformer layers", ge=1)
    hidden_size: int = spec(ge=1)
    ffn_hidden_size: int = spec(ge=1)
    num_attention_heads: int = spec(ge=1)
    vocab_size: int = spec(
        ge=1,
        help="rows of the HF embedding (MindSpeed calls it padded_vocab_size); mindrl pads it "
        "further to a multiple of make_vocab_size_divisible_by x TP inside megatron",
        aliases=("padded_vocab_size",),
    )
    max_position_embeddings: int = spec(ge=1)
    name: str = spec(
        "",
        help="set from the model file's top-level key",
        fate=no_effect("a label: mindrl names the model by its model file's top-level key"),
    )
    model_type_hf: str = spec(
        LLAMA.name,
        choices=registry.MODEL_TYPE_HF_NAMES,
        help="HF architecture variant; MindSpeed-RL yamls have none: config-time inference "
        "(mindrl.config.model_family.infer_family) sets it from config.json or the keys",
    )
    group_query_attention: bool = False
    num_query_groups: int | None = spec(None, ge=1, help="kv heads when group_query_attention")
    kv_channels: int | None = spec(None, ge=1, help="head dim; default hidden / heads")
    make_vocab_size_divisible_by: int = spec(1, ge=1)
    rotary_base: float = spec(10000.0, gt=0)
    norm_epsilon: float = spec(1e-6, gt=0)
    add_qkv_bias: bool = False
    qk_layernorm: bool = spec(
        False,
        help="RMSNorm over each query / key head before RoPE (Qwen3); config-time inference "
        "sets it from the family",
    )
    disable_bias_linear: bool = True
    untie_embeddings_and_output_weights: bool = True
    position_embedding_type: str = spec(
        "rope",
        fate=refused("only rotary position embeddings (rope) are built", allowed=("rope",)),
    )
    normalization: str = spec(
        "RMSNorm", fate=refused("only RMSNorm is built (LayerNorm: not yet)", allowed=("RMSNorm",))
    )
    swiglu: bool = True
    use_mcore_models: bool = spec(
        True,
        fate=refused(
            "megatron's legacy (non-mcore) models: not built; mindrl builds megatron-core models",
            allowed=(True,),
        ),
    )
    attention_dropout: float = spec(0.0, ge=0, lt=1)
    hidden_dropout: float = spec(0.0, ge=0, lt=1)
    init_method_std: float = spec(0.02, gt=0)
    rope_scaling_type: str | None = spec(
        None,
        help="llama3: Llama 3.1 / 3.2 frequency scaling of RoPE; yarn: DeepSeek-V3's (with "
        "multi_latent_attention)",
        fate=refused(
            "RoPE scaling other than llama3 and yarn (linear, dynamic, longrope): not built yet",
            allowed=(None, *ROPE_SCALING_BUILT),
        ),
    )
    rope_scaling_factor: float = spec(1.0, gt=0, help="llama3 scaling factor (8 in Llama 3.1)")
    low_freq_factor: float | None = spec(None, gt=0, help="llama3 scaling (1 in Llama 3.1)")
    high_freq_factor: float | None = spec(None, gt=0, help="llama3 scaling (4 in Llama 3.1)")
    original_max_position_embeddings: int | None = spec(
        None, ge=1, help="llama3 scaling: the pre-training context (8192 in Llama 3.1)"
    )
    beta_fast: float = spec(
        32.0, gt=0, help="yarn: fast rotation boundary", aliases=("rope_scaling_beta_fast",)
    )
    beta_slow: float = spec(
        1.0, gt=0, help="yarn: slow rotation boundary", aliases=("rope_scaling_beta_slow",)
    )
    rope_scaling_mscale: float = spec(1.0, ge=0, help="yarn: mscale of the rotary embedding")
    rope_scaling_mscale_all_dim: float = spec(
        0.0, ge=0, help="yarn: mscale_all_dim (also scales the attention softmax)"
    )
    rope_scaling_original_max_position_embeddings: int | None = spec(
        None, ge=1, help="yarn: the pre-training context (4096 in DeepSeek-V3)"
    )
    multi_latent_attention: bool = spec(
        False,
        help="DeepSeek-V3's multi-latent attention (low-rank q and compressed kv)",
        aliases=("multi_head_latent_attention",),
    )
    q_lora_rank: int | None = spec(None, ge=1, help="MLA: query latent size (None: direct q)")
    kv_lora_rank: int | None = spec(None, ge=1, help="MLA: key/value latent size (cached)")
    qk_head_dim: int | None = spec(
        None, ge=1, help="MLA: q/k head dim without RoPE", aliases=("qk_nope_head_dim",)
    )
    qk_pos_emb_head_dim: int | None = spec(
        None, ge=1, help="MLA: q/k head dim with RoPE", aliases=("qk_rope_head_dim",)
    )
    v_head_dim: int | None = spec(None, ge=1, help="MLA: value head dim")
    num_experts: int | None = spec(None, ge=2, help="routed experts per layer (None: dense MLP)")
    moe_ffn_hidden_size: int | None = spec(
        None, ge=1, help="each expert's ffn size", aliases=("moe_intermediate_size",)
    )
    moe_router_topk: int = spec(2, ge=1, help="experts per token")
    norm_topk_prob: bool = spec(
        False,
        help="renormalise the top-k routing probabilities to sum to 1 (Qwen3-MoE: true); "
        "megatron: softmax over the top-k logits, else top-k of the softmax",
    )
    moe_router_score_function: str = spec(
        "softmax",
        choices=("softmax", "sigmoid"),
        help="sigmoid: DeepSeek-V3's routing (top-k probabilities always renormalised)",
    )
    moe_router_enable_expert_bias: bool = spec(
        False, help="a per-expert bias added to the scores for the top-k choice only (DeepSeek-V3)"
    )
    moe_router_num_groups: int | None = spec(
        None, ge=1, help="group-limited routing: expert groups", aliases=("n_group",)
    )
    moe_router_group_topk: int | None = spec(
        None, ge=1, help="group-limited routing: groups kept per token", aliases=("topk_group",)
    )
    moe_router_topk_scaling_factor: float | None = spec(
        None, gt=0, help="routing probabilities times this", aliases=("routed_scaling_factor",)
    )
    n_shared_experts: int | None = spec(
        None, ge=1, help="shared experts of every MoE layer: one MLP of n x moe_ffn_hidden_size"
    )
    moe_shared_expert_intermediate_size: int | None = spec(
        None,
        ge=1,
        help="the shared expert's ffn size (Qwen2-MoE); n_shared_experts sets it for DeepSeek",
        aliases=("shared_expert_intermediate_size",),
    )
    shared_expert_gate: bool = spec(
        False,
        help="a sigmoid gate on the shared expert's output (Qwen2-MoE)",
        aliases=("moe_shared_expert_gate",),
    )
    first_k_dense_replace: int | None = spec(
        None, ge=0, help="the first k layers have a dense MLP (DeepSeek-V3: 3)"
    )
    moe_layer_freq: int | None = spec(
        None, ge=1, help="every n-th layer (after the dense ones) is MoE (None: every one)"
    )
    moe_router_load_balancing_type: str = spec(
        "aux_loss", choices=("aux_loss", "seq_aux_loss", "none"), help="the router's balance loss"
    )
    moe_aux_loss_coeff: float = spec(0.0, ge=0, help="weight of the load-balancing loss")
    moe_z_loss_coeff: float | None = spec(None, ge=0, help="weight of the router z-loss")
    moe_token_dispatcher_type: str = spec(
        "alltoall",
        choices=tuple(MOE_DISPATCHERS),
        help="token dispatch over expert parallel ranks (alltoall_seq: MindSpeed's name, "
        "built as megatron's alltoall)",
    )
    noop_layers: str | int | None = spec(
        None,
        help='MindSpeed\'s noop layers ("5,95"): global layer indices built as identity '
        "layers without weights; num_layers counts them, the HF checkpoint does not",
    )

    @property
    def family(self) -> str:
        """The model family `model_type_hf` names (`mindrl.families`: its mapping table,
        features and HF classes)."""
        family = registry.family_of_variant(self.model_type_hf)
        if family is None:
            raise ValueError(
                f"model_type_hf {self.model_type_hf!r} names no model family mindrl builds "
                f"(known: {', '.join(registry.MODEL_TYPE_HF_NAMES)})"
            )
        return family

    @property
    def noop_layer_indices(self) -> tuple[int, ...]:
        """The noop layers' global indices, sorted (`config/layer_layout.py` checks them)."""
        return tuple(sorted(set(parse_index_list(self.noop_layers, "noop_layers"))))

    @property
    def hf_num_layers(self) -> int:
        """Layers of the HF checkpoint: the noop layers hold no weights there."""
        return self.num_layers - len(self.noop_layer_indices)

    def hf_layer(self, layer: int) -> int:
        """The HF index of megatron's global layer `layer` (its noop layers skipped)."""
        return layer - sum(1 for i in self.noop_layer_indices if i < layer)

    def mcore_num_layers(self, hf_layers: int) -> int:
        """megatron's num_layers for an HF model of `hf_layers` layers plus the noop ones."""
        return hf_layers + len(self.noop_layer_indices)

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def expert_ffn_hidden_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def shared_expert_ffn_hidden_size(self) -> int | None:
        """The shared expert's ffn size (None: no shared expert): Qwen2-MoE gives it, DeepSeek
        gives n_shared_experts (of moe_ffn_hidden_size each, run as one MLP)."""
        if self.moe_shared_expert_intermediate_size is not None:
            return self.moe_shared_expert_intermediate_size
        if self.n_shared_experts:
            return self.n_shared_experts * self.expert_ffn_hidden_size
        return None

    @property
    def moe_layer_pattern(self) -> tuple[bool, ...]:
        """Whether each global layer's MLP is the MoE layer: none for a dense model; after
        the first `first_k_dense_replace` dense layers, every `moe_layer_freq`-th layer."""
        dense = self.first_k_dense_replace or 0
        return tuple(
            self.is_moe and i >= dense and i % (self.moe_layer_freq or 1) == 0
            for i in range(self.num_layers)
        )

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe_layer_pattern[layer]

    @property
    def has_dense_layers(self) -> bool:
        """A MoE model with some dense MLP layers (DeepSeek-V3's first three)."""
        return self.is_moe and not all(self.moe_layer_pattern)

    @property
    def q_head_dim(self) -> int:
        """Each query / key head's width: MLA's no-RoPE plus RoPE parts, else head_dim."""
        if self.multi_latent_attention:
            return (self.qk_head_dim or 0) + (self.qk_pos_emb_head_dim or 0)
        return self.head_dim

    def mla_problems(self) -> list[str]:
        """What makes the multi-latent attention keys incomplete (one line each)."""
        keys = ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        family_mla = registry.family_spec(self.family).features.mla
        if self.multi_latent_attention != family_mla:
            return [
                f"multi_latent_attention: {str(self.multi_latent_attention).lower()} does not "
                f"fit model family {self.family}"
            ]
        if not self.multi_latent_attention:
            stray = [k for k in (*keys, "q_lora_rank") if getattr(self, k) is not None]
            problems = [f"{k}: set without multi_latent_attention: true" for k in stray]
            if self.rope_scaling_type == "yarn":
                problems.append("rope_scaling_type: yarn is built with multi_latent_attention")
            return problems
        problems = [
            f"{k}: required with multi_latent_attention" for k in keys if getattr(self, k) is None
        ]
        if self.qk_layernorm and self.q_lora_rank is None:
            problems.append("qk_layernorm with multi_latent_attention needs q_lora_rank")
        return problems

    def family_feature_problems(self) -> list[str]:
        """The MoE and attention features this model asks for that its family's mapping table
        has no weights for (shared experts on Qwen3-MoE, DeepSeek's routing on Qwen2-MoE, ...):
        the checkpoint could not hold them."""
        spec = registry.family_spec(self.family)
        whens = {r.when for r in spec.rules}
        layer_kinds = {r.layers for r in spec.rules}
        asked = {
            "n_shared_experts / moe_shared_expert_intermediate_size (shared experts)": (
                self.shared_expert_ffn_hidden_size is not None and "shared_expert" not in whens
            ),
            "shared_expert_gate": self.shared_expert_gate and "shared_expert_gate" not in whens,
            "moe_router_enable_expert_bias": (
                self.moe_router_enable_expert_bias and "expert_bias" not in whens
            ),
            "first_k_dense_replace / moe_layer_freq (dense layers among MoE layers)": (
                self.has_dense_layers and "dense" not in layer_kinds
            ),
            "moe_router_score_function: sigmoid": (
                self.moe_router_score_function == "sigmoid" and not spec.features.mla
            ),
            "moe_router_num_groups / moe_router_topk_scaling_factor (grouped, scaled routing)": (
                bool(self.moe_router_num_groups or self.moe_router_topk_scaling_factor)
                and not spec.features.mla
            ),
        }
        builders = ", ".join(
            s.display_name for s in registry.built_families() if s.features.moe and s != spec
        )
        return [
            f"{what}: the {spec.display_name} family has none (mindrl's MoE families: "
            f"{spec.display_name}, {builders})"
            for what, on in asked.items()
            if on
        ]

    def routing_problems(self) -> list[str]:
        """What makes the router keys contradictory (one line each)."""
        problems = []
        groups, group_topk = self.moe_router_num_groups, self.moe_router_group_topk
        if (groups is None) != (group_topk is None) and (groups or 1) > 1:
            problems.append("moe_router_num_groups and moe_router_group_topk go together")
        if groups and group_topk and self.num_experts:
            if self.num_experts % groups:
                problems.append(
                    f"moe_router_num_groups: {groups} does not divide num_experts "
                    f"{self.num_experts}"
                )
            if group_topk > groups:
                problems.append(f"moe_router_group_topk: {group_topk} exceeds {groups} groups")
        if self.moe_router_enable_expert_bias and self.moe_router_score_function != "sigmoid":
            problems.append("moe_router_enable_expert_bias: megatron builds it for sigmoid routing")
        if self.moe_router_score_function == "sigmoid" and self.moe_router_topk > 1:
            if not self.norm_topk_prob:
                problems.append(
                    "moe_router_score_function: sigmoid renormalises the top-k probabilities "
                    "in megatron-core: set norm_topk_prob: true"
                )
        return problems

    def moe_problems(self) -> list[str]:
        """What makes the MoE keys contradictory (one line each)."""
        family_is_moe = registry.family_spec(self.family).features.moe
        if self.num_experts is None:
            return [f"model_type_hf: {self.family} needs num_experts"] if family_is_moe else []
        problems = []
        if self.moe_router_topk > self.num_experts:
            problems.append(
                f"moe_router_topk: {self.moe_router_topk} exceeds num_experts {self.num_experts}"
            )
        problems += self.routing_problems()
        problems += self.family_feature_problems()
        if not family_is_moe:
            built = ", ".join(
                s.display_name + (" (qk_layernorm: true)" if s.features.qk_norm else "")
                for s in registry.built_families()
                if s.features.moe
            )
            problems.append(
                f"num_experts with model family {self.family}: mindrl builds {built} experts only"
            )
        return problems

    @property
    def num_kv_heads(self) -> int:
        if self.group_query_attention and self.num_query_groups:
            return self.num_query_groups
        return self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def tie_word_embeddings(self) -> bool:
        return not self.untie_embeddings_and_output_weights

    def padded_vocab_size(self, tensor_parallel_size: int) -> int:
        """Embedding rows inside megatron: vocab padded to a multiple of divisor x TP."""
        multiple = self.make_vocab_size_divisible_by * tensor_parallel_size
        return -(-self.vocab_size // multiple) * multiple

    def rope_scaling_problems(self) -> list[str]:
        """What makes the RoPE scaling keys incomplete or contradictory (one line each): every
        llama3 parameter must be given, since HF and megatron default them differently; yarn
        needs its pre-training context."""
        problems = []
        if self.rope_scaling_type != "yarn":
            problems = [
                f"{k}: set without rope_scaling_type: yarn"
                for k, default in YARN_DEFAULTS.items()
                if getattr(self, k) != default
            ]
        if self.rope_scaling_type is None:
            stray = [k for k in ("rope_scaling_factor",) if getattr(self, k) != 1.0]
            stray += [k for k in LLAMA3_ROPE_KEYS if getattr(self, k) is not None]
            return problems + [f"{k}: set without rope_scaling_type (use llama3)" for k in stray]
        if self.rope_scaling_type == "yarn":
            if self.rope_scaling_original_max_position_embeddings is None:
                return ["rope_scaling_original_max_position_embeddings: required with yarn"]
            return []
        problems += [
            f"{k}: required with rope_scaling_type {self.rope_scaling_type}"
            for k in LLAMA3_ROPE_KEYS
            if getattr(self, k) is None
        ]
        if not problems and self.high_freq_factor <= self.low_freq_factor:  # type: ignore[operator]
            problems.append(
                f"high_freq_factor: {self.high_freq_factor} must exceed low_freq_factor "
                f"({self.low_freq_factor})"
            )
        return problems

    def rope_scaling_hf(self) -> dict[str, float | int | str] | None:
        """The HF `rope_scaling` dict of this model (None: plain RoPE)."""
        if self.rope_scaling_type is None:
            return None
        if self.rope_scaling_type == "yarn":
            return {
                "rope_type": "yarn",
                "factor": self.rope_scaling_factor,
                "beta_fast": self.beta_fast,
                "beta_slow": self.beta_slow,
                "mscale": self.rope_scaling_mscale,
                "mscale_all_dim": self.rope_scaling_mscale_all_dim,
                "original_max_position_embeddings": self.rope_scaling_original_max_position_embeddings,  # type: ignore[dict-item]
            }
        return {
            "rope_type": self.rope_scaling_type,
            "factor": self.rope_scaling_factor,
            "low_freq_factor": self.low_freq_factor,  # type: ignore[dict-item]
            "high_freq_factor": self.high_freq_factor,  # type: ignore[dict-item]
            "original_max_position_embeddings": self.original_max_position_embeddings,  # type: ignore[dict-item]
        }
