"""What mindrl knows about one model family, as data: `FamilySpec` (a family it builds) and
`UnbuiltFamily` (one it knows by name and refuses, with the reason).

A family module fills one `FamilySpec`; `mindrl.families.registry` holds them, and the config
layer, the model builder, the converter, the weight sync and the assets read them from there
instead of keeping their own tables. Nothing here imports torch or `mindrl.config` (the config
layer imports this package), so the architecture is seen through `ArchFeatures`-like shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mindrl.families.rules import ParamRule


class FamilyConfigError(ValueError):
    """An HF config.json of a built family asks for something its family module cannot map
    (the converter reports it as a `ConversionError`, same text)."""


@dataclass(frozen=True)
class Features:
    """The layer features that tell families apart (MindSpeed-RL yamls carry no family name:
    config-time inference matches these against the yaml's keys)."""

    qkv_bias: bool = False  # biases on q, k and v (Qwen2)
    qk_norm: bool = False  # RMSNorm over each query / key head (Qwen3)
    moe: bool = False  # routed experts in every layer's MLP
    mla: bool = False  # multi-latent attention (DeepSeek-V2 / V3)
    vision: bool = False  # a vision encoder in front of the decoder


def _no_fields(_: Any) -> dict[str, Any]:
    return {}


def _nothing_dropped(names: list[str], num_hidden_layers: int) -> list[str]:
    return []


@dataclass(frozen=True)
class FamilySpec:
    """Everything mindrl knows about a family it builds.

    `name` is mindrl's family name and the HF `model_type`; `variants` are the other names the
    model yaml's `model_type_hf` / the converter's `--model-type-hf` accept for it (recorded as
    given); `aliases` other spellings that resolve to it (MindSpeed-LLM's). `hf_architecture`
    and `hf_config_class` are the transformers classes an export writes and both rollout
    engines build. `rules` is the mapping table read both ways by the converter and the weight
    sync. `arch_fields_from_hf` returns the family's own `ModelArchConfig` fields of a
    config.json (raising `FamilyConfigError`), `hf_fields_from_arch` the family's own HF config
    arguments of an architecture; the Llama-like rest is shared (`mindrl.models.hf_arch`).
    """

    name: str
    display_name: str
    hf_architecture: str
    hf_config_class: str
    rules: tuple[ParamRule, ...]
    features: Features = Features()
    variants: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    # the family this one is with q/k/v biases (MindSpeed-RL spells Qwen2 llama2 + --add-qkv-bias)
    qkv_bias_variant: str | None = None
    # a word in MindSpeed's `spec:` (layer spec module path) that marks this family's features
    layer_spec_hint: str = ""
    # a MindSpeed yaml key (set on) that only this family has (multi_latent_attention)
    yaml_marker: str = ""
    arch_fields_from_hf: Callable[[Mapping[str, Any]], dict[str, Any]] = _no_fields
    hf_fields_from_arch: Callable[[Any], dict[str, Any]] = _no_fields
    # the HF tensors of a checkpoint that are not the causal LM's (DeepSeek's multi-token
    # prediction layers): the converter and the online loader skip them with a notice
    dropped_hf_tensors: Callable[[list[str], int], list[str]] = _nothing_dropped
    # extra transformers config arguments of the tiny random test models (`mindrl.assets`)
    tiny_hf_fields: Mapping[str, Any] = field(default_factory=dict)

    @property
    def model_type_names(self) -> tuple[str, ...]:
        """Every `model_type_hf` value that builds this family (its name first)."""
        return (self.name, *(v for v in self.variants if v != self.name))


@dataclass(frozen=True)
class UnbuiltFamily:
    """A family mindrl knows but does not build: refused by name, with what it lacks.

    `spellings` are the `model_type_hf` names that mean it, `hf_architectures` the HF classes
    that name it in a config.json; `yaml_marker` / `layer_spec_hint` are a MindSpeed yaml key
    (set on) / a word of its `spec:` that only this family has.
    """

    name: str
    reason: str
    features: Features = Features()
    spellings: tuple[str, ...] = ()
    hf_architectures: tuple[str, ...] = ()
    yaml_marker: str = ""
    layer_spec_hint: str = ""
