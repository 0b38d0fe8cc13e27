"""The one registry of model families: the families mindrl builds (`FamilySpec`) and those it
knows only to refuse (`UnbuiltFamily`), in registration order (mindrl's own first, so a family
registered later never shadows one of them).

`mindrl.families` registers the built-in families at import; `register_family(spec)` adds one
from any module at run time (a user's, a test's) and every reader sees it: `model_type_hf`
validation, config-time family inference, HF config <-> `ModelArchConfig`, the mapping table of
the converter and the weight sync, the tiny test models.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, overload

from mindrl.families.spec import FamilySpec, Features, UnbuiltFamily

_BUILT: dict[str, FamilySpec] = {}
_UNBUILT: dict[str, UnbuiltFamily] = {}


def _taken_names() -> dict[str, str]:
    """Every name a family answers to -> the family."""
    names: dict[str, str] = {}
    for spec in _BUILT.values():
        for name in (*spec.model_type_names, *spec.aliases):
            names[name.lower()] = spec.name
    for unbuilt in _UNBUILT.values():
        for name in (unbuilt.name, *unbuilt.spellings):
            names[name.lower()] = unbuilt.name
    return names


def register_family(spec: FamilySpec) -> FamilySpec:
    """Add a family mindrl builds; its names must be new (a family is defined in one place)."""
    taken = _taken_names()
    clashes = [n for n in (*spec.model_type_names, *spec.aliases) if n.lower() in taken]
    if clashes:
        raise ValueError(
            f"model family {spec.name}: {', '.join(clashes)} already name(s) model family "
            f"{taken[clashes[0].lower()]}"
        )
    _BUILT[spec.name] = spec
    return spec


def register_unbuilt(family: UnbuiltFamily) -> UnbuiltFamily:
    """Add a family mindrl knows by name and refuses with `family.reason`."""
    taken = _taken_names()
    clashes = [n for n in (family.name, *family.spellings) if n.lower() in taken]
    if clashes:
        raise ValueError(f"model family {family.name}: {', '.join(clashes)} already taken")
    _UNBUILT[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Remove a family registered at run time (tests restore the registry with it)."""
    _BUILT.pop(name, None)
    _UNBUILT.pop(name, None)


def built_families() -> tuple[FamilySpec, ...]:
    return tuple(_BUILT.values())


def built_names() -> tuple[str, ...]:
    """The families mindrl builds, in registration order (llama, qwen2, qwen3, qwen3_moe, ...)."""
    return tuple(_BUILT)


def built_list() -> str:
    """'llama, qwen2, qwen3 and qwen3_moe': what refusals say mindrl builds."""
    names = built_names()
    return f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]


def built_family(name: str) -> FamilySpec | None:
    return _BUILT.get(name)


def family_spec(name: str) -> FamilySpec:
    """The spec of a built family (KeyError naming the known ones otherwise)."""
    try:
        return _BUILT[name]
    except KeyError:
        raise KeyError(f"model family {name!r} is not built; known: {sorted(_BUILT)}") from None


def variant_families() -> dict[str, str]:
    """`model_type_hf` value -> the built family it names (llama2 -> llama, qwen25 -> qwen2)."""
    return {v: s.name for s in _BUILT.values() for v in s.model_type_names}


def family_of_variant(variant: str) -> str | None:
    return variant_families().get(variant)


def alias_family(spelling: str) -> str | None:
    """The family (built or not) another `model_type_hf` spelling means (qwen3-moe,
    deepseekv3, qwen2_vl -> multimodal), case-insensitive."""
    key = spelling.lower()
    for spec in _BUILT.values():
        if key in (a.lower() for a in spec.aliases):
            return spec.name
    for unbuilt in _UNBUILT.values():
        if key in (s.lower() for s in unbuilt.spellings):
            return unbuilt.name
    return None


def known_spellings() -> list[str]:
    """Every `model_type_hf` name mindrl recognises, sorted (for "known: ..." lines)."""
    names = set(variant_families())
    names.update(a for s in _BUILT.values() for a in s.aliases)
    names.update(n for u in _UNBUILT.values() for n in u.spellings)
    return sorted(names)


def family_of_model_type(model_type: str) -> FamilySpec | None:
    """The built family whose HF config.json `model_type` this is."""
    return _BUILT.get(model_type)


def family_of_architecture(hf_class: str) -> str | None:
    """The family (built or not) an HF `architectures` class names."""
    for spec in _BUILT.values():
        if spec.hf_architecture == hf_class:
            return spec.name
    for unbuilt in _UNBUILT.values():
        if hf_class in unbuilt.hf_architectures:
            return unbuilt.name
    return None


def unbuilt_reason(name: str) -> str | None:
    """What mindrl lacks for a family it knows but does not build (None: not one of them)."""
    unbuilt = _UNBUILT.get(name)
    return unbuilt.reason if unbuilt else None


def qkv_bias_family() -> FamilySpec:
    """The first built family with q/k/v biases (what a `--add-qkv-bias` checkpoint is)."""
    return next(s for s in _BUILT.values() if s.features.qkv_bias)


def qk_norm_family() -> FamilySpec:
    """The first built family with q/k norm (Qwen3: what `qk_layernorm: true` builds)."""
    return next(s for s in _BUILT.values() if s.features.qk_norm)


def family_for_features(features: Features) -> str | None:
    """The first registered family (built, then unbuilt) with exactly these features."""
    for spec in _BUILT.values():
        if spec.features == features:
            return spec.name
    for unbuilt in _UNBUILT.values():
        if unbuilt.features == features:
            return unbuilt.name
    return None


def marked_families() -> tuple[FamilySpec | UnbuiltFamily, ...]:
    """Families a MindSpeed yaml marks by a key only they have (`multi_latent_attention`:
    DeepSeek-V3, built) or, for unbuilt ones, a word of its layer spec."""
    built = tuple(s for s in _BUILT.values() if s.yaml_marker)
    return built + tuple(u for u in _UNBUILT.values() if u.yaml_marker or u.layer_spec_hint)


def layer_spec_hints() -> tuple[str, ...]:
    """Every family word of a MindSpeed-LLM layer spec mindrl knows (built or refused)."""
    hints = [s.layer_spec_hint for s in _BUILT.values()]
    hints += [u.layer_spec_hint for u in _UNBUILT.values()]
    return tuple(dict.fromkeys(h for h in hints if h))


def spec_hints_qk_norm(spec_text: str) -> bool:
    """Whether a MindSpeed layer `spec:` names a family with q/k norm (a Qwen3 spec)."""
    text = spec_text.lower()
    return any(
        s.features.qk_norm and s.layer_spec_hint and s.layer_spec_hint in text
        for s in _BUILT.values()
    )


def classify_hf_config(cfg: Mapping[str, Any]) -> tuple[str, str]:
    """(family, what mindrl lacks for it) of an HF config.json dict; the reason is '' for the
    families mindrl builds."""
    model_type = str(cfg.get("model_type") or "")
    archs = [a for a in cfg.get("architectures") or () if isinstance(a, str)]
    if _has_vision(model_type, archs, cfg):
        vision = next(u for u in _UNBUILT.values() if u.features.vision)
        return model_type or vision.name, f"{vision.name}: {vision.reason}"
    family = model_type or next(
        (f for f in map(family_of_architecture, archs) if f is not None), ""
    )
    if not family:
        return "unknown", "config.json names no model_type or known architectures"
    if family in _BUILT:
        return family, ""
    return family, unbuilt_reason(family) or "no mapping table"


def _has_vision(model_type: str, archs: Sequence[str], cfg: Mapping[str, Any]) -> bool:
    return (
        "vision_config" in cfg
        or "_vl" in model_type
        or any(a.endswith("ForConditionalGeneration") for a in archs)
    )


def is_known_unbuilt(cfg: Mapping[str, Any]) -> bool:
    """Whether an HF config.json is of a family mindrl knows it does not build (refused by
    name, as at config time), rather than one it has never heard of."""
    family, _ = classify_hf_config(cfg)
    archs = [a for a in cfg.get("architectures") or () if isinstance(a, str)]
    return family in _UNBUILT or _has_vision(str(cfg.get("model_type") or ""), archs, cfg)


class QkNormArch(Protocol):
    """An architecture as the feature check reads it (`ModelArchConfig` has these)."""

    @property
    def family(self) -> str: ...

    @property
    def qk_layernorm(self) -> bool: ...


def qk_norm_problem(arch: QkNormArch) -> str | None:
    """Why `arch`'s qk_layernorm contradicts its family (None when it fits): the one check both
    the mapping table and the HF export make."""
    spec = family_spec(arch.family)
    if arch.qk_layernorm == spec.features.qk_norm:
        return None
    owner = qk_norm_family()
    return (
        f"qk_layernorm={arch.qk_layernorm} does not fit the {arch.family} mapping "
        f"(q/k layernorm is {owner.display_name}'s: model_type_hf {owner.name})"
    )


class LiveNames(Sequence[str]):
    """The `model_type_hf` names as a sequence that follows the registry (a config field's
    choices: families registered after import are valid too)."""

    def _names(self) -> list[str]:
        return list(variant_families())

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, value: object) -> bool:
        return value in variant_families()

    def __repr__(self) -> str:
        return repr(tuple(self._names()))


MODEL_TYPE_HF_NAMES = LiveNames()
