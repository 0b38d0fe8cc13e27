"""HF <-> megatron-core parameter mapping: one declarative table per architecture family.

Each `ParamRule` names one megatron-core parameter, the HF tensor(s) it is made of, the symbolic
HF shapes, and its split rule over tensor parallelism. Both directions read the same entries
(`mindrl.checkpoint.transforms` implements each split rule forwards and backwards), so the
HF -> mcore and mcore -> HF renames cannot drift apart.

Names use megatron-core's local layer spec ("decoder.layers.{layer}.input_layernorm.weight");
`TE_ALIASES` gives the transformer-engine spec's names for the norms it fuses into the
following linear layer. `{layer}` is the global layer index; a pipeline stage holds its layers
under local indices (`mindrl.checkpoint.online` translates).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from mindrl.checkpoint.errors import ConversionError
from mindrl.config.model_arch import ModelArchConfig


class Split(str, Enum):
    """How a megatron-core parameter is laid out over TP ranks (and built from HF tensors)."""

    REPLICATED = "replicated"  # norms: every TP rank holds the whole tensor
    COLUMN = "column"  # dim 0 (output features) split evenly over TP
    ROW = "row"  # dim 1 (input features) split evenly over TP
    VOCAB = "vocab"  # dim 0 padded to the padded vocab, then split evenly over TP
    QKV = "qkv"  # q, k, v fused per query group [q heads of group, k, v]; groups split over TP
    GATE_UP = "gate_up"  # gate and up each split over TP; rank r holds [gate_r; up_r]


@dataclass(frozen=True)
class ParamRule:
    """One megatron-core parameter and the HF tensor(s) it corresponds to.

    `hf_shapes` gives each HF tensor's shape in symbols: hidden, ffn, vocab, q (= heads x
    head_dim), kv (= kv heads x head_dim), head (= head_dim). `when` restricts the rule to architectures with
    qkv_bias / tied / untied embeddings. `load_only` rules fill a megatron parameter that is a
    copy of another (the tied output layer on the last pipeline stage); exports skip them.
    """

    mcore: str
    hf: tuple[str, ...]
    hf_shapes: tuple[tuple[str, ...], ...]
    split: Split
    when: str | None = None
    load_only: bool = False

    @property
    def per_layer(self) -> bool:
        return "{layer}" in self.mcore

    @property
    def per_expert(self) -> bool:
        return "{expert}" in self.mcore

    def applies_to(self, arch: ModelArchConfig) -> bool:
        return {
            None: True,
            "qkv_bias": arch.add_qkv_bias,
            "tied": arch.tie_word_embeddings,
            "untied": not arch.tie_word_embeddings,
        }[self.when]


_L = "model.layers.{layer}."
_D = "decoder.layers.{layer}."

LLAMA_RULES: tuple[ParamRule, ...] = (
    ParamRule(
        "embedding.word_embeddings.weight",
        ("model.embed_tokens.weight",),
        (("vocab", "hidden"),),
        Split.VOCAB,
    ),
    ParamRule(
        _D + "input_layernorm.weight",
        (_L + "input_layernorm.weight",),
        (("hidden",),),
        Split.REPLICATED,
    ),
    ParamRule(
        _D + "self_attention.linear_qkv.weight",
        (
            _L + "self_attn.q_proj.weight",
            _L + "self_attn.k_proj.weight",
            _L + "self_attn.v_proj.weight",
        ),
        (("q", "hidden"), ("kv", "hidden"), ("kv", "hidden")),
        Split.QKV,
    ),
    ParamRule(
        _D + "self_attention.linear_proj.weight",
        (_L + "self_attn.o_proj.weight",),
        (("hidden", "q"),),
        Split.ROW,
    ),
    ParamRule(
        _D + "pre_mlp_layernorm.weight",
        (_L + "post_attention_layernorm.weight",),
        (("hidden",),),
        Split.REPLICATED,
    ),
    ParamRule(
        _D + "mlp.linear_fc1.weight",
        (_L + "mlp.gate_proj.weight", _L + "mlp.up_proj.weight"),
        (("ffn", "hidden"), ("ffn", "hidden")),
        Split.GATE_UP,
    ),
    ParamRule(
        _D + "mlp.linear_fc2.weight",
        (_L + "mlp.down_proj.weight",),
        (("hidden", "ffn"),),
        Split.ROW,
    ),
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

QWEN2_RULES: tuple[ParamRule, ...] = LLAMA_RULES + (
    ParamRule(
        _D + "self_attention.linear_qkv.bias",
        (_L + "self_attn.q_proj.bias", _L + "self_attn.k_proj.bias", _L + "self_attn.v_proj.bias"),
        (("q",), ("kv",), ("kv",)),
        Split.QKV,
        when="qkv_bias",
    ),
)

# Qwen3: Llama plus an RMSNorm over each query / key head (one weight of head_dim, shared by
# every head, so every TP rank holds all of it), placed after the QKV projection.
QWEN3_RULES: tuple[ParamRule, ...] = (
    LLAMA_RULES[:3]
    + (
        ParamRule(
            _D + "self_attention.q_layernorm.weight",
            (_L + "self_attn.q_norm.weight",),
            (("head",),),
            Split.REPLICATED,
        ),
        ParamRule(
            _D + "self_attention.k_layernorm.weight",
            (_L + "self_attn.k_norm.weight",),
            (("head",),),
            Split.REPLICATED,
        ),
    )
    + LLAMA_RULES[3:]
)

# Qwen3-MoE: Qwen3's attention; the MLP is a router (one row of logits weights per expert,
# replicated over TP) and `{expert}` SwiGLU experts, each split over TP like a dense MLP. The
# mcore names carry the *global* expert index (megatron's checkpoint key); an expert-parallel
# rank holds experts [ep_rank x E / EP, ...) under local indices (`mindrl.checkpoint.online`).
_E = _D + "mlp.experts.local_experts.{expert}."
_HE = _L + "mlp.experts.{expert}."
QWEN3_MOE_RULES: tuple[ParamRule, ...] = (
    tuple(
        r
        for r in QWEN3_RULES
        if ".mlp.linear_fc" not in r.mcore
        and "final_layernorm" not in r.mcore
        and "output_layer" not in r.mcore
    )
    + (
        ParamRule(
            _D + "mlp.router.weight",
            (_L + "mlp.gate.weight",),
            (("experts", "hidden"),),
            Split.REPLICATED,
        ),
        ParamRule(
            _E + "linear_fc1.weight",
            (_HE + "gate_proj.weight", _HE + "up_proj.weight"),
            (("moe_ffn", "hidden"), ("moe_ffn", "hidden")),
            Split.GATE_UP,
        ),
        ParamRule(
            _E + "linear_fc2.weight",
            (_HE + "down_proj.weight",),
            (("hidden", "moe_ffn"),),
            Split.ROW,
        ),
    )
    + tuple(r for r in QWEN3_RULES if "final_layernorm" in r.mcore or "output_layer" in r.mcore)
)

TABLES: dict[str, tuple[ParamRule, ...]] = {
    "llama": LLAMA_RULES,
    "qwen2": QWEN2_RULES,
    "qwen3": QWEN3_RULES,
    "qwen3_moe": QWEN3_MOE_RULES,
}

# transformer-engine spec: the norms are fused into the next linear layer.
TE_ALIASES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}

# HF tensors a checkpoint may carry that hold no model state.
IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class BoundRule:
    """A rule with its layer filled in: concrete mcore and HF names and HF shapes."""

    rule: ParamRule
    layer: int | None
    expert: int | None
    mcore: str
    hf: tuple[str, ...]
    hf_shapes: tuple[tuple[int, ...], ...]

    @property
    def split(self) -> Split:
        return self.rule.split


def rules_for(arch: ModelArchConfig) -> tuple[ParamRule, ...]:
    """The mapping table of `arch`'s family, restricted to what the architecture has."""
    table = TABLES.get(arch.family)
    if table is None:
        raise ConversionError(
            f"no mapping table for architecture family {arch.family!r} "
            f"(model_type_hf={arch.model_type_hf!r}); known: {sorted(TABLES)}"
        )
    if arch.add_qkv_bias and not any(r.when == "qkv_bias" for r in table):
        raise ConversionError(
            f"--add-qkv-bias is set but the {arch.family} mapping has no QKV bias "
            "(use --model-type-hf qwen2 for Qwen2 checkpoints)"
        )
    if arch.qk_layernorm != (arch.family in ("qwen3", "qwen3_moe")):
        raise ConversionError(
            f"qk_layernorm={arch.qk_layernorm} does not fit the {arch.family} mapping "
            "(q/k layernorm is Qwen3's: model_type_hf qwen3)"
        )
    return tuple(r for r in table if r.applies_to(arch))


def symbol_sizes(arch: ModelArchConfig) -> dict[str, int]:
    return {
        "hidden": arch.hidden_size,
        "ffn": arch.ffn_hidden_size,
        "vocab": arch.vocab_size,
        "q": arch.num_attention_heads * arch.head_dim,
        "kv": arch.num_kv_heads * arch.head_dim,
        "head": arch.head_dim,
        "experts": arch.num_experts or 0,
        "moe_ffn": arch.expert_ffn_hidden_size,
    }


def bind(
    rule: ParamRule, arch: ModelArchConfig, layer: int | None, expert: int | None = None
) -> BoundRule:
    sizes = symbol_sizes(arch)
    fmt: dict[str, int] = {"layer": layer} if layer is not None else {}
    if expert is not None:
        fmt["expert"] = expert
    return BoundRule(
        rule=rule,
        layer=layer,
        expert=expert,
        mcore=rule.mcore.format(**fmt),
        hf=tuple(name.format(**fmt) for name in rule.hf),
        hf_shapes=tuple(tuple(sizes[s] for s in shape) for shape in rule.hf_shapes),
    )


def bound_rules(
    arch: ModelArchConfig, *, layers: range | None = None, include_load_only: bool = False
) -> list[BoundRule]:
    """Every parameter of the model in a stable order: embedding, layers 0..L-1, final norm,
    output layer; within a layer, each per-expert rule for experts 0..E-1. `layers` restricts
    the per-layer entries (e.g. one pipeline stage's)."""
    rules = [r for r in rules_for(arch) if include_load_only or not r.load_only]
    layers = range(arch.num_layers) if layers is None else layers
    out = [bind(r, arch, None) for r in rules if not r.per_layer and r.mcore.startswith("emb")]
    experts = range(arch.num_experts or 0)
    for layer in layers:
        for r in rules:
            if r.per_expert:
                out.extend(bind(r, arch, layer, e) for e in experts)
            elif r.per_layer:
                out.append(bind(r, arch, layer))
    out.extend(
        bind(r, arch, None) for r in rules if not r.per_layer and not r.mcore.startswith("emb")
    )
    return out


def expected_hf_tensors(arch: ModelArchConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, for every tensor an HF checkpoint of `arch` must contain."""
    out: dict[str, tuple[int, ...]] = {}
    for bound in bound_rules(arch):
        out.update(zip(bound.hf, bound.hf_shapes))
    return out


def hf_output_plan(arch: ModelArchConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every exported tensor, in the order exports produce them."""
    return [(name, shape) for b in bound_rules(arch) for name, shape in zip(b.hf, b.hf_shapes)]


def te_name(local_name: str) -> str:
    """The transformer-engine spec's name for a local-spec parameter name (or the same)."""
    for local, te in TE_ALIASES.items():
        if local_name.endswith(local):
            return local_name[: -len(local)] + te
    return local_name
