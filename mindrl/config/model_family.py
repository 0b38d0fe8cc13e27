"""Which model family a model yaml describes, decided at config time (json + pathlib, no torch).

MindSpeed-RL's model yamls have no `model_type_hf`: the family shows in the HF config.json of
the checkpoint / tokenizer folder, or in the keys (`add_qkv_bias`: Qwen2, `qk_layernorm`:
Qwen3, MoE keys, `multi_latent_attention`: DeepSeek-V3). Deciding it here refuses a family
mindrl cannot build by name before any worker starts, and resolves a yaml that contradicts its
checkpoint (config.json wins, with a notice) instead of failing at weight loading.

The families, their names and features come from the one registry (`mindrl.families`); the
converter (`mindrl.models.hf_arch`) classifies HF configs with it too.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mindrl.families import registry
from mindrl.families.spec import Features

__all__ = [
    "FEATURE_KEYS",
    "MOE_KEYS",
    "FamilyDecision",
    "folder_evidence",
    "hf_config_refusal",
    "infer_family",
]

# Model-yaml keys that mark a family's features (MoE keys with qk_layernorm: Qwen3-MoE, built;
# without it: families mindrl does not build), beside the keys the registry's unbuilt families
# are marked by (`multi_latent_attention`, `mm_model`). Their "off" values are consumed here
# (dropped before `ModelArchConfig` is built), so `qk_layernorm: false` is not an "unknown key".
FEATURE_KEYS = ("qk_layernorm", "attention_bias")
MOE_KEYS = (
    "num_experts",
    "n_shared_experts",
    "first_k_dense_replace",
    "moe_layer_freq",
    "expert_model_parallel_size",
)

# MindSpeed-LLM's layer specs: `spec: [mindspeed_llm.tasks.models.spec.<family>_spec, layer_spec]`
MINDSPEED_LLM_SPECS = "mindspeed_llm.tasks.models.spec"
LAYER_SPEC_ATTR = "layer_spec"

# mindrl megatron checkpoint layout (mirrors mindrl.checkpoint.mcore_io, which imports torch).
TRACKER_FILE = "latest_checkpointed_iteration.txt"
META_FILE = "mindrl_checkpoint.json"
HF_ASSETS_DIR = "hf_assets"


@dataclass(frozen=True)
class FamilyDecision:
    """The family a model section describes, where that came from, and what to build.

    `refusal` is set (one line) when mindrl cannot build it; otherwise `model_type_hf`,
    `add_qkv_bias` and `qk_layernorm` are the values `ModelArchConfig` must get
    (`arch_section` applies them).
    """

    family: str
    source: str
    model_type_hf: str | None = None
    add_qkv_bias: bool | None = None
    refusal: str | None = None
    notices: tuple[str, ...] = ()
    consumed_keys: tuple[str, ...] = ()

    @property
    def supported(self) -> bool:
        return self.refusal is None

    def describe(self) -> str:
        """One line for the dry run: the family, its source, and any resolved contradiction."""
        if self.refusal:
            return self.refusal
        line = f"model family {self.family} (from {self.source})"
        return line + "".join(f"; {n}" for n in self.notices)

    def arch_section(self, section: Mapping[str, Any]) -> dict[str, Any]:
        """`section` ready for `ModelArchConfig`: family keys consumed, family values set."""
        if self.refusal:
            raise ValueError(self.refusal)
        out = {k: v for k, v in section.items() if k not in self.consumed_keys}
        out["model_type_hf"] = self.model_type_hf
        out["add_qkv_bias"] = self.add_qkv_bias
        out["qk_layernorm"] = registry.family_spec(self.family).features.qk_norm
        return out


@dataclass(frozen=True)
class _Evidence:
    family: str
    what: str  # "DIR/config.json (model_type qwen2)", "model yaml qk_layernorm: true", ...
    reason: str = ""  # what mindrl lacks, for a family it does not build
    refusal: str | None = None  # a refusal that is not about a family (custom layer spec)

    def refuse(self) -> str:
        if self.refusal:
            return self.refusal
        reason = self.reason or registry.unbuilt_reason(self.family) or "no mapping table"
        return (
            f"model family {self.family} ({reason}) is not supported yet (from {self.what}); "
            f"mindrl builds {registry.built_list()}"
        )


def _is_on(key: str, value: Any) -> bool:
    if key == "expert_model_parallel_size":
        return isinstance(value, int) and not isinstance(value, bool) and value > 1
    return value not in (None, False, 0, "", [], {})


def _hf_label(cfg: Mapping[str, Any]) -> str:
    parts = []
    if cfg.get("model_type"):
        parts.append(f"model_type {cfg['model_type']}")
    if isinstance(cfg.get("architectures"), list) and cfg["architectures"]:
        parts.append(", ".join(map(str, cfg["architectures"])))
    return ", ".join(parts) or "no model_type"


def _hf_evidence(cfg: Mapping[str, Any], source: Path | str) -> _Evidence:
    family, reason = registry.classify_hf_config(cfg)
    return _Evidence(family, f"{source} ({_hf_label(cfg)})", reason)


def hf_config_refusal(cfg: Mapping[str, Any], source: str) -> str | None:
    """The one-line refusal of an HF config whose family mindrl does not build, else None."""
    evidence = _hf_evidence(cfg, source)
    return None if _is_built(evidence.family) else evidence.refuse()


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, f"{path} is not readable JSON ({first})"


def _iteration_dir(folder: Path) -> Path | None:
    """A mindrl megatron checkpoint's iteration folder (a root via its tracker, or itself)."""
    if (folder / META_FILE).is_file():
        return folder
    tracker = folder / TRACKER_FILE
    if not tracker.is_file():
        return None
    try:
        text = tracker.read_text(encoding="utf-8").strip()
        name = "release" if text == "release" else f"iter_{int(text):07d}"
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # the loader names a bad tracker; here there is just no record
    return folder / name if (folder / name).is_dir() else None


def _checkpoint_evidence(iter_dir: Path) -> _Evidence | str | None:
    """The family a mindrl megatron checkpoint records (hf_assets/config.json, else its
    mindrl_checkpoint.json)."""
    assets = iter_dir / HF_ASSETS_DIR / "config.json"
    if assets.is_file():
        cfg, problem = _read_json(assets)
        if problem or not isinstance(cfg, dict):
            return problem or f"{assets} is not a JSON object"
        return _hf_evidence(cfg, assets)
    meta_path = iter_dir / META_FILE
    if not meta_path.is_file():
        return None
    meta, problem = _read_json(meta_path)
    if problem or not isinstance(meta, dict):
        return problem or f"{meta_path} is not a JSON object"
    hf_cfg = meta.get("hf_config")
    if isinstance(hf_cfg, dict) and (hf_cfg.get("model_type") or hf_cfg.get("architectures")):
        return _hf_evidence(hf_cfg, meta_path)
    arch = meta.get("arch")
    variant = arch.get("model_type_hf") if isinstance(arch, dict) else None
    family = registry.family_of_variant(variant) if isinstance(variant, str) else None
    if family is not None:
        return _Evidence(family, f"{meta_path} (model_type_hf {variant})")
    return None


def folder_evidence(folder: str | Path) -> _Evidence | str | None:
    """What a folder says about the family: its HF config.json, or a mindrl megatron
    checkpoint's record. None when it says nothing; a one-line problem when unreadable."""
    path = Path(folder)
    if not path.is_dir():
        return None
    config = path / "config.json"
    if config.is_file():
        cfg, problem = _read_json(config)
        if problem or not isinstance(cfg, dict):
            return problem or f"{config} is not a JSON object"
        return _hf_evidence(cfg, config)
    iter_dir = _iteration_dir(path)
    return None if iter_dir is None else _checkpoint_evidence(iter_dir)


def _spec_text(section: Mapping[str, Any]) -> str:
    spec = section.get("spec")
    return " ".join(map(str, spec)) if isinstance(spec, (list, tuple)) else str(spec or "")


def spec_hint(section: Mapping[str, Any]) -> str | None:
    """The family word of a MindSpeed-LLM layer spec the model yaml names, None for no spec or
    one mindrl does not know. MindSpeed-RL's yamls name it `[MODULE, layer_spec]`, MODULE
    being `mindspeed_llm.tasks.models.spec.<family>_spec` (qwen3_spec for Qwen3 dense and
    MoE, deepseek_spec for DeepSeek-V3)."""
    spec = section.get("spec")
    parts = [str(p) for p in spec] if isinstance(spec, (list, tuple)) else [str(spec or "")]
    module, _, attr = parts[0].partition(":") if len(parts) == 1 else (parts[0], "", parts[1])
    prefix, _, leaf = module.rpartition(".")
    if prefix != MINDSPEED_LLM_SPECS or attr not in ("", LAYER_SPEC_ATTR):
        return None
    hint = leaf.removesuffix("_spec")
    return hint if hint != leaf and hint in registry.layer_spec_hints() else None


def _key_evidence(section: Mapping[str, Any]) -> _Evidence | None:
    """The family the yaml keys mark as one mindrl does not build (MLA, multimodal, MoE,
    q/k layernorm, a custom layer spec), else None."""
    on = [k for k in section if _is_marker(k) and _is_on(k, section[k])]
    moe = [k for k in on if k in MOE_KEYS or k.startswith("moe_")]
    if not any(k in MOE_KEYS for k in moe):
        moe = []  # router settings (MindSpeed's defaults spelled out) without experts: dense
    spec_text = _spec_text(section)
    hint = spec_hint(section)
    from_spec = f"model yaml spec: {spec_text}"

    def shown(keys: Sequence[str]) -> str:
        return "model yaml " + ", ".join(f"{k}: {_yaml(section[k])}" for k in keys)

    for marked in registry.marked_families():  # MLA (DeepSeek), a vision model
        if marked.yaml_marker in on:
            return _Evidence(
                marked.name, shown([marked.yaml_marker, *(moe[:1] if marked.features.moe else [])])
            )
        if marked.layer_spec_hint and marked.layer_spec_hint == hint:
            return _Evidence(marked.name, from_spec)
    qk_keys = ["qk_layernorm"] if "qk_layernorm" in on else []
    qk_norm = bool(qk_keys) or registry.spec_hints_qk_norm(hint or "")
    if moe:
        bias = not qk_norm and bool(section.get("add_qkv_bias"))
        family = registry.family_for_features(Features(qkv_bias=bias, qk_norm=qk_norm, moe=True))
        return _Evidence(family or "unknown", shown(moe[:2] + qk_keys))
    if qk_norm:  # qk_layernorm: true, or MindSpeed-LLM's Qwen3 layer spec
        owner = registry.qk_norm_family()
        return _Evidence(owner.name, shown(qk_keys) if qk_keys else from_spec)
    if "attention_bias" in on:
        return _Evidence(
            "attention_bias",
            shown(["attention_bias"]),
            refusal="model yaml attention_bias: true (a bias on the attention output "
            "projection) is not supported; mindrl builds q/k/v biases only (add_qkv_bias)",
        )
    if spec_text:
        return _Evidence(
            "custom",
            from_spec,
            refusal=f"model yaml spec: {spec_text}: a custom layer spec is not supported; "
            "mindrl knows MindSpeed-LLM's "
            + ", ".join(f"{MINDSPEED_LLM_SPECS}.{h}_spec" for h in registry.layer_spec_hints())
            + " and builds megatron-core's GPT layer spec (or remove spec)",
        )
    return None


def _is_marker(key: str) -> bool:
    return (
        key in FEATURE_KEYS
        or key in MOE_KEYS
        or key.startswith("moe_")
        or any(key == marked.yaml_marker for marked in registry.marked_families())
    )


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _is_built(family: str) -> bool:
    return registry.built_family(family) is not None


def _yaml_family(section: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """(family, source, model_type_hf variant) from `model_type_hf` / `add_qkv_bias` alone."""
    variant = section.get("model_type_hf")
    if variant is not None:
        name = str(variant)
        family = registry.family_of_variant(name)
        if family is not None:
            return family, f"model yaml model_type_hf: {name}", name
        return registry.alias_family(name) or name, f"model yaml model_type_hf: {name}", None
    if section.get("add_qkv_bias") is True:
        biased = registry.qkv_bias_family().name
        return biased, "model yaml add_qkv_bias: true", None
    plain = registry.family_for_features(Features()) or registry.built_names()[0]
    return plain, "default: no config.json found, no family keys in the model yaml", None


def infer_family(
    arch_section: Mapping[str, Any], hf_dirs: Sequence[str | Path | None] = ()
) -> FamilyDecision:
    """`_infer_family`, then a MindSpeed-LLM layer `spec:` the decided family is built from
    consumed with a notice that says which builder takes it (a spec of another family is
    refused naming both)."""
    decision = _infer_family(arch_section, hf_dirs)
    hint = spec_hint(arch_section)
    if decision.refusal or hint is None:
        return decision
    spec_text = _spec_text(arch_section)
    qk_norm = registry.spec_hints_qk_norm(hint)
    covered = [
        s
        for s in registry.built_families()
        if s.layer_spec_hint == hint or (qk_norm and s.features.qk_norm)
    ]
    built = registry.family_spec(decision.family)
    if built not in covered:
        names = " / ".join(s.display_name for s in covered)
        return dataclasses.replace(
            decision,
            refusal=f"model yaml spec: {spec_text} is MindSpeed-LLM's {names} layer spec, but "
            f"the model is {built.display_name} (from {decision.source}): fix spec or the model",
        )
    return dataclasses.replace(
        decision,
        notices=(
            *decision.notices,
            f"spec {spec_text}: built by mindrl's {built.display_name} builder "
            "(megatron-core's GPT layers with the family's features)",
        ),
        consumed_keys=(*decision.consumed_keys, "spec"),
    )


def _infer_family(
    arch_section: Mapping[str, Any], hf_dirs: Sequence[str | Path | None] = ()
) -> FamilyDecision:
    """Decide the model family of `arch_section` (the model yaml's keys, as merged for a role).

    `hf_dirs` are the role's folders in priority order (e.g. `load`, `tokenizer_name_or_path`;
    None / missing / hub names are skipped): the first with an HF config.json (or a mindrl
    megatron checkpoint record) decides and overrides `model_type_hf` / `add_qkv_bias` with a
    notice; folders that disagree are refused. Without one, the yaml keys decide. Families
    mindrl cannot build are refused by name.
    """
    section = {str(k): v for k, v in arch_section.items()}
    consumed = tuple(k for k in section if _is_marker(k) and not _is_on(k, section[k]))
    records: list[_Evidence] = []
    for folder in hf_dirs:
        found = folder_evidence(folder) if folder else None
        if isinstance(found, str):
            return FamilyDecision("unknown", str(folder), refusal=f"model family: {found}")
        if found is not None:
            records.append(found)
    keys = _key_evidence(section)
    if keys is not None and _is_built(keys.family) and not keys.refusal:
        # the yaml's keys mark a family mindrl builds (qk_layernorm: Qwen3)
        if not records:
            return _resolved_by_config(section, keys, consumed)
        if records[0].family == keys.family:
            keys = None
    if not records:
        if keys is not None:
            return FamilyDecision(keys.family, keys.what, refusal=keys.refuse())
        return _decided_by_keys(section, consumed)
    first = records[0]
    for other in records[1:]:
        if other.family != first.family:
            return FamilyDecision(
                first.family,
                first.what,
                refusal=f"model family: {first.what} is {first.family} but {other.what} is "
                f"{other.family}; point load and tokenizer_name_or_path at the same model",
            )
    if not _is_built(first.family):
        return FamilyDecision(first.family, first.what, refusal=first.refuse())
    if keys is not None:
        said = keys.refuse() if not _is_built(keys.family) else f"{keys.what} is {keys.family}"
        return FamilyDecision(
            keys.family, keys.what, refusal=f"{said}; {first.what} is {first.family}: fix it"
        )
    return _resolved_by_config(section, first, consumed)


def _resolved_by_config(
    section: Mapping[str, Any], record: _Evidence, consumed: tuple[str, ...]
) -> FamilyDecision:
    """config.json decides; yaml values that disagree with it are overridden, with a notice."""
    family, notices = record.family, []
    features = registry.family_spec(family).features
    variant = section.get("model_type_hf")
    model_type_hf = family
    if variant is not None:
        if registry.family_of_variant(str(variant)) == family:
            model_type_hf = str(variant)
        else:
            notices.append(f"model_type_hf: {variant} overridden: {record.what} is {family}")
    want_bias = features.qkv_bias
    bias = section.get("add_qkv_bias")
    if isinstance(bias, bool) and bias is not want_bias:
        notices.append(
            f"add_qkv_bias: {_yaml(bias)} overridden: {record.what} is {family} "
            f"({'with' if want_bias else 'without'} q/k/v biases)"
        )
    qk = section.get("qk_layernorm")
    has_qk = features.qk_norm
    if isinstance(qk, bool) and qk is not has_qk:
        notices.append(
            f"qk_layernorm: {_yaml(qk)} overridden: {record.what} is {family} "
            f"({'with' if has_qk else 'without'} q/k layernorm)"
        )
    return FamilyDecision(
        family,
        record.what,
        model_type_hf=model_type_hf,
        add_qkv_bias=want_bias,
        notices=tuple(notices),
        consumed_keys=consumed,
    )


def _decided_by_keys(section: Mapping[str, Any], consumed: tuple[str, ...]) -> FamilyDecision:
    """No config.json: `model_type_hf`, else `add_qkv_bias: true` (Qwen2), else llama."""
    family, source, variant = _yaml_family(section)
    built = registry.built_family(family)
    if built is None:
        if registry.unbuilt_reason(family) is not None:
            return FamilyDecision(family, source, refusal=_Evidence(family, source).refuse())
        known = ", ".join(registry.known_spellings())
        return FamilyDecision(
            family,
            source,
            refusal=f"model yaml model_type_hf: {family!r} is not a model family mindrl knows "
            f"(known: {known})",
        )
    bias = section.get("add_qkv_bias")
    notices = []
    if built.qkv_bias_variant is not None and bias is True:
        # MindSpeed-RL's converter spells Qwen2 as llama2 + --add-qkv-bias: Llama + q/k/v bias
        biased = built.qkv_bias_variant
        notices.append(
            f"model_type_hf: {variant} with add_qkv_bias: true is {biased} "
            f"({built.display_name} with q/k/v biases)"
        )
        source = f"{source}, add_qkv_bias: true"
        family, variant, built = biased, None, registry.family_spec(biased)
    elif built.features.qk_norm and (section.get("qk_layernorm") is False or bias is True):
        owner = registry.qk_norm_family()  # Qwen3-MoE has Qwen3's attention
        why = f"{source} with qk_layernorm: false or add_qkv_bias: true: {owner.display_name} "
        why += "has q/k layernorm and no q/k/v biases"
        return FamilyDecision(family, source, refusal=why)
    elif built.features.qkv_bias and bias is False:
        plain = [s.name for s in registry.built_families() if s.qkv_bias_variant == family]
        instead = f", or model_type_hf: {plain[0]} for a model without them" if plain else ""
        return FamilyDecision(
            family,
            source,
            refusal=f"{source} with add_qkv_bias: false: {built.display_name} has q/k/v biases; "
            f"set add_qkv_bias: true{instead}",
        )
    return FamilyDecision(
        family,
        source,
        model_type_hf=variant or family,
        add_qkv_bias=built.features.qkv_bias,
        notices=tuple(notices),
        consumed_keys=consumed,
    )
