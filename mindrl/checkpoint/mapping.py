"""HF <-> megatron-core parameter mapping: each family's declarative table, bound to an
architecture.

The tables live in the family modules (`mindrl.families`: one `ParamRule` per megatron-core
parameter, with its HF tensor(s), symbolic HF shapes and split rule over tensor parallelism);
both directions read the same entries (`mindrl.checkpoint.transforms` implements each split
rule forwards and backwards), so the HF -> mcore and mcore -> HF renames cannot drift apart.
Here they are bound to an architecture's sizes, layers and experts.

Names use megatron-core's local layer spec ("decoder.layers.{layer}.input_layernorm.weight");
`TE_ALIASES` gives the transformer-engine spec's names for the norms it fuses into the
following linear layer. `{layer}` is the global layer index; a pipeline stage holds its layers
under local indices (`mindrl.checkpoint.online` translates); HF names skip MindSpeed's noop
layers, which hold no weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from mindrl.checkpoint.errors import ConversionError
from mindrl.config.model_arch import ModelArchConfig
from mindrl.families import registry
from mindrl.families.rules import ParamRule, Split


class _Tables(Mapping[str, tuple[ParamRule, ...]]):
    """family -> its mapping table, as the family registry holds them now (a family registered
    at run time has its table here too)."""

    def __getitem__(self, family: str) -> tuple[ParamRule, ...]:
        spec = registry.built_family(family)
        if spec is None:
            raise KeyError(family)
        return spec.rules

    def __iter__(self) -> Iterator[str]:
        return iter(registry.built_names())

    def __len__(self) -> int:
        return len(registry.built_names())


TABLES: Mapping[str, tuple[ParamRule, ...]] = _Tables()

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
        biased = registry.qkv_bias_family()
        raise ConversionError(
            f"--add-qkv-bias is set but the {arch.family} mapping has no QKV bias "
            f"(use --model-type-hf {biased.name} for {biased.display_name} checkpoints)"
        )
    problem = registry.qk_norm_problem(arch)
    if problem:
        raise ConversionError(problem)
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
        "shared_ffn": arch.shared_expert_ffn_hidden_size or 0,
        "one": 1,
        **mla_sizes(arch),
    }


def mla_sizes(arch: ModelArchConfig) -> dict[str, int]:
    """The shape symbols of multi-latent attention ({} without it)."""
    if not arch.multi_latent_attention:
        return {}
    heads = arch.num_attention_heads
    rope, nope, v = arch.qk_pos_emb_head_dim or 0, arch.qk_head_dim or 0, arch.v_head_dim or 0
    return {
        "q_lora": arch.q_lora_rank or 0,
        "kv_lora": arch.kv_lora_rank or 0,
        "kv_down": (arch.kv_lora_rank or 0) + rope,
        "q_up": heads * (nope + rope),
        "kv_up": heads * (nope + v),
        "v_out": heads * v,
    }


def bind(
    rule: ParamRule, arch: ModelArchConfig, layer: int | None, expert: int | None = None
) -> BoundRule:
    sizes = symbol_sizes(arch)
    fmt: dict[str, int] = {"layer": layer} if layer is not None else {}
    if expert is not None:
        fmt["expert"] = expert
    # the HF checkpoint has no noop layers: its layer indices skip them
    hf_fmt = {**fmt, "layer": arch.hf_layer(layer)} if layer is not None else fmt
    return BoundRule(
        rule=rule,
        layer=layer,
        expert=expert,
        mcore=rule.mcore.format(**fmt),
        hf=tuple(name.format(**hf_fmt) for name in rule.hf),
        hf_shapes=tuple(tuple(sizes[s] for s in shape) for shape in rule.hf_shapes),
    )


def bound_rules(
    arch: ModelArchConfig, *, layers: Sequence[int] | None = None, include_load_only: bool = False
) -> list[BoundRule]:
    """Every parameter of the model in a stable order: embedding, layers 0..L-1, final norm,
    output layer; within a layer, each per-expert rule for experts 0..E-1. `layers` restricts
    the per-layer entries (e.g. one pipeline stage's). MindSpeed's noop layers have no
    entries: they hold no weights."""
    rules = [r for r in rules_for(arch) if include_load_only or not r.load_only]
    noop = set(arch.noop_layer_indices)
    layers = [i for i in (range(arch.num_layers) if layers is None else layers) if i not in noop]
    out = [bind(r, arch, None) for r in rules if not r.per_layer and r.mcore.startswith("emb")]
    experts = range(arch.num_experts or 0)
    for layer in layers:
        for r in rules:
            if r.per_layer and not r.applies_to_layer(arch, layer):
                continue  # a dense layer's MLP in a MoE model, or the other way round
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


def dropped_hf_tensors(arch: ModelArchConfig, names: Sequence[str]) -> list[str]:
    """The tensors of an HF checkpoint that are not part of `arch`'s causal LM and are skipped
    by name (DeepSeek-V3's multi-token-prediction layers)."""
    spec = registry.family_spec(arch.family)
    return spec.dropped_hf_tensors(list(names), arch.hf_num_layers)


def dropped_notice(dropped: Sequence[str]) -> str:
    """One line naming what a conversion skipped."""
    layers = sorted({".".join(n.split(".")[:3]) for n in dropped})
    return (
        f"dropped {len(dropped)} HF tensors of the multi-token-prediction layers "
        f"({', '.join(layers)}): not part of the causal LM mindrl trains"
    )


def hf_output_plan(arch: ModelArchConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, shape) of every exported tensor, in the order exports produce them."""
    return [(name, shape) for b in bound_rules(arch) for name, shape in zip(b.hf, b.hf_shapes)]


def te_name(local_name: str) -> str:
    """The transformer-engine spec's name for a local-spec parameter name (or the same)."""
    for local, te in TE_ALIASES.items():
        if local_name.endswith(local):
            return local_name[: -len(local)] + te
    return local_name
