"""HF `config.json` <-> `ModelArchConfig`.

The converter and the online loader only have an HF folder; the trainer has a
`ModelArchConfig`. These two functions translate between them and refuse (with a
`ConversionError` naming the key) any HF feature the megatron-core model built by
`mindrl.models.gpt` would silently get wrong: rope scaling other than llama3, sliding windows,
biases on o_proj or the MLP, a non-SiLU activation, dense layers among Qwen3-MoE's expert
layers. What differs between families (q/k/v biases, q/k norm, experts, the HF classes) comes
from the family's module through the registry (`mindrl.families`); the Llama-like rest is read
here once for all of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mindrl.checkpoint.errors import ConversionError
from mindrl.config.model_arch import ModelArchConfig
from mindrl.config.model_family import hf_config_refusal
from mindrl.families import registry
from mindrl.families.spec import FamilyConfigError

LLAMA3_HF_KEYS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)


def read_hf_config(src: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """config.json as a dict, from a dict, an HF config object, a folder or the file itself."""
    if isinstance(src, Mapping):
        return dict(src)
    if hasattr(src, "to_dict"):
        return dict(src.to_dict())
    path = Path(src)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConversionError(f"HF config not found: {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(f"HF config {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConversionError(f"HF config {path} is not a JSON object")
    return data


def _config_source(src: object) -> str:
    """How a refusal names the config: its file when it came from disk."""
    if isinstance(src, (str, Path)):
        path = Path(src)
        return str(path / "config.json" if path.is_dir() else path)
    return "HF config"


def _rope(cfg: Mapping[str, Any], yarn_built: bool = False) -> tuple[float, dict[str, Any]]:
    """rope_theta and the RoPE scaling fields of `ModelArchConfig` (llama3; yarn for a family
    with multi-latent attention), from transformers >= 5 (`rope_parameters`) or older configs
    (`rope_theta` + `rope_scaling`)."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    rope = dict(params) if isinstance(params, Mapping) else {}
    if isinstance(scaling, Mapping):
        rope = {**dict(scaling), **rope}
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in (None, "default"):
        return theta, {}
    key = "rope_parameters" if isinstance(params, Mapping) else "rope_scaling"
    if rope_type == "yarn" and yarn_built:
        return theta, _yarn_fields(rope, key)
    if rope_type != "llama3":
        raise ConversionError(
            f"HF config {key}.rope_type={rope_type!r} is not supported (mindrl builds plain "
            "RoPE, llama3 scaling and DeepSeek's yarn; linear / dynamic / longrope and yarn "
            "without multi-latent attention: not built yet)"
        )
    missing = [k for k in LLAMA3_HF_KEYS if rope.get(k) is None]
    if missing:
        raise ConversionError(f"HF config {key} (llama3) has no {missing[0]!r}")
    return theta, {
        "rope_scaling_type": "llama3",
        "rope_scaling_factor": float(rope["factor"]),
        "low_freq_factor": float(rope["low_freq_factor"]),
        "high_freq_factor": float(rope["high_freq_factor"]),
        "original_max_position_embeddings": int(rope["original_max_position_embeddings"]),
    }


def _yarn_fields(rope: Mapping[str, Any], key: str) -> dict[str, Any]:
    """`ModelArchConfig`'s yarn fields; refuses the yarn variants megatron-core's
    YarnRotaryEmbedding computes differently from HF."""
    for needed in ("factor", "original_max_position_embeddings"):
        if rope.get(needed) is None:
            raise ConversionError(f"HF config {key} (yarn) has no {needed!r}")
    if rope.get("attention_factor") is not None or rope.get("truncate") is False:
        raise ConversionError(
            f"HF config {key} (yarn) sets attention_factor or truncate=false: megatron-core's "
            "yarn derives the attention factor from mscale / mscale_all_dim and truncates"
        )
    mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if not (mscale and all_dim) and not (not all_dim and mscale in (None, 1, 1.0)):
        raise ConversionError(
            f"HF config {key} (yarn) mscale={mscale}, mscale_all_dim={all_dim}: HF and "
            "megatron-core scale the rotary embedding alike only with both set, or "
            "mscale_all_dim unset and mscale 1"
        )
    return {
        "rope_scaling_type": "yarn",
        "rope_scaling_factor": float(rope["factor"]),
        "beta_fast": float(rope.get("beta_fast") or 32),
        "beta_slow": float(rope.get("beta_slow") or 1),
        "rope_scaling_mscale": float(mscale or 1.0),
        "rope_scaling_mscale_all_dim": float(all_dim or 0.0),
        "rope_scaling_original_max_position_embeddings": int(
            rope["original_max_position_embeddings"]
        ),
    }


def _require(cfg: Mapping[str, Any], key: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConversionError(f"HF config has no {key!r}")
    return cfg[key]


def arch_from_hf_config(
    src: str | Path | Mapping[str, Any], *, model_type_hf: str | None = None
) -> ModelArchConfig:
    """The `ModelArchConfig` of an HF checkpoint of a registered family (folder, config.json
    or dict).

    `model_type_hf` (the converter's `--model-type-hf`: llama2, qwen25, ...) names the variant;
    its family must agree with the config's `model_type`.
    """
    cfg = read_hf_config(src)
    hf_type = cfg.get("model_type")
    spec = registry.family_of_model_type(hf_type) if isinstance(hf_type, str) else None
    if spec is None:
        if registry.is_known_unbuilt(cfg):
            # a family mindrl knows it does not build: refused by name, as at config time
            raise ConversionError(hf_config_refusal(cfg, _config_source(src)))
        raise ConversionError(
            f"unknown architecture: HF model_type={hf_type!r} "
            f"(architectures={cfg.get('architectures')}); the mapping tables know "
            f"{sorted(registry.built_names())}"
        )
    family = spec.name
    if model_type_hf is None:
        model_type_hf = family
    variant_family = registry.family_of_variant(model_type_hf)
    if variant_family is None:
        raise ConversionError(
            f"--model-type-hf {model_type_hf!r} is not one of "
            f"{sorted(registry.MODEL_TYPE_HF_NAMES)}"
        )
    if variant_family != family:
        raise ConversionError(
            f"--model-type-hf {model_type_hf!r} is a {variant_family} model but the "
            f"HF config says model_type={hf_type!r}"
        )
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConversionError(f"HF config hidden_act={act!r} is not supported (SwiGLU needs silu)")
    for key in ("attention_bias", "mlp_bias"):
        if not spec.features.qkv_bias and cfg.get(key):
            raise ConversionError(
                f"HF config {key}=true is not supported (bias on o_proj / the MLP has no "
                "megatron-core mapping here)"
            )
    if cfg.get("use_sliding_window"):
        raise ConversionError("HF config use_sliding_window=true is not supported")

    heads = int(_require(cfg, "num_attention_heads"))
    hidden = int(_require(cfg, "hidden_size"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    rotary_base, rope_scaling = _rope(cfg, yarn_built=spec.features.mla)
    try:
        family_fields = spec.arch_fields_from_hf(cfg)
    except FamilyConfigError as exc:
        raise ConversionError(str(exc)) from exc
    return ModelArchConfig(
        num_layers=int(_require(cfg, "num_hidden_layers")),
        hidden_size=hidden,
        ffn_hidden_size=int(_require(cfg, "intermediate_size")),
        num_attention_heads=heads,
        vocab_size=int(_require(cfg, "vocab_size")),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
        name=str(cfg.get("_name_or_path") or ""),
        model_type_hf=model_type_hf,
        group_query_attention=kv_heads != heads,
        num_query_groups=kv_heads,
        kv_channels=head_dim,
        make_vocab_size_divisible_by=1,
        rotary_base=rotary_base,
        **rope_scaling,
        norm_epsilon=float(cfg.get("rms_norm_eps", 1e-6)),
        add_qkv_bias=spec.features.qkv_bias,
        qk_layernorm=spec.features.qk_norm,
        disable_bias_linear=True,
        untie_embeddings_and_output_weights=not bool(cfg.get("tie_word_embeddings", False)),
        swiglu=True,
        attention_dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        hidden_dropout=0.0,
        init_method_std=float(cfg.get("initializer_range", 0.02)),
        **family_fields,
    )


def hf_config_from_arch(arch: ModelArchConfig, *, dtype: str = "float32") -> dict[str, Any]:
    """A config.json dict transformers loads as the HF twin of `arch` (for mcore -> HF exports
    when no original HF config is at hand). `dtype` is a torch dtype name (float32, bfloat16)."""
    import transformers

    spec = registry.family_spec(arch.family)
    if spec.features.qkv_bias and not arch.add_qkv_bias:
        raise ConversionError(
            f"a {arch.family} model without add_qkv_bias has no HF {spec.display_name} equivalent"
        )
    if not spec.features.qkv_bias and arch.add_qkv_bias:
        raise ConversionError(f"a {arch.family} model with add_qkv_bias has no HF equivalent")
    problem = registry.qk_norm_problem(arch)
    if problem:
        raise ConversionError(problem)
    if not arch.disable_bias_linear or not arch.swiglu:
        raise ConversionError("only bias-free SwiGLU models (disable_bias_linear, swiglu) export")
    rope_scaling = arch.rope_scaling_hf()
    extra: dict[str, Any] = {"rope_scaling": rope_scaling} if rope_scaling else {}
    extra.update(spec.hf_fields_from_arch(arch))
    config_cls = getattr(transformers, spec.hf_config_class)
    fields: dict[str, Any] = dict(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.ffn_hidden_size,
        num_hidden_layers=arch.hf_num_layers,  # noop layers have no HF twin
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        rms_norm_eps=arch.norm_epsilon,
        rope_theta=arch.rotary_base,
        tie_word_embeddings=arch.tie_word_embeddings,
        attention_dropout=arch.attention_dropout,
        initializer_range=arch.init_method_std,
        torch_dtype=dtype,
    )
    fields.update(extra)  # the family's own fields win (DeepSeek's head_dim: the RoPE width)
    out: dict[str, Any] = config_cls(**fields).to_dict()
    out["architectures"] = [spec.hf_architecture]
    return out
