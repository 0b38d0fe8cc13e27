"""HF `config.json` <-> `ModelArchConfig`.

The converter and the online loader only have an HF folder; the trainer has a
`ModelArchConfig`. These two functions translate between them and refuse (with a
`ConversionError` naming the key) any HF feature the megatron-core model built by
`mindrl.models.gpt` would silently get wrong: rope scaling other than llama3, sliding windows,
biases on o_proj or the MLP, a non-SiLU activation, dense layers among Qwen3-MoE's expert
layers. Qwen3's q/k norm follows from its family.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mindrl.checkpoint.errors import ConversionError
from mindrl.config.model_arch import HF_FAMILIES, ModelArchConfig
from mindrl.config.model_family import NOT_BUILT, classify_hf_config, hf_config_refusal

# HF `model_type` -> mindrl mapping family, and the HF class that family saves as.
HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe"}
HF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
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


def _rope(cfg: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """rope_theta and the llama3 scaling fields of `ModelArchConfig`, from transformers >= 5
    (`rope_parameters`) or older configs (`rope_theta` + `rope_scaling`)."""
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
    if rope_type != "llama3":
        raise ConversionError(
            f"HF config {key}.rope_type={rope_type!r} is not supported (mindrl builds plain "
            "RoPE and llama3 scaling; yarn / linear / dynamic / longrope: not built yet)"
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


def _require(cfg: Mapping[str, Any], key: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConversionError(f"HF config has no {key!r}")
    return cfg[key]


def arch_from_hf_config(
    src: str | Path | Mapping[str, Any], *, model_type_hf: str | None = None
) -> ModelArchConfig:
    """The `ModelArchConfig` of an HF Llama / Qwen2 / Qwen3 checkpoint (folder, config.json or
    dict).

    `model_type_hf` (the converter's `--model-type-hf`: llama2, qwen25, ...) names the variant;
    its family must agree with the config's `model_type`.
    """
    cfg = read_hf_config(src)
    hf_type = cfg.get("model_type")
    if hf_type not in HF_MODEL_TYPES:
        family, reason = classify_hf_config(cfg)
        if family in NOT_BUILT or reason.startswith("multimodal"):
            # a family mindrl knows it does not build: refused by name, as at config time
            raise ConversionError(hf_config_refusal(cfg, _config_source(src)))
        raise ConversionError(
            f"unknown architecture: HF model_type={hf_type!r} "
            f"(architectures={cfg.get('architectures')}); the mapping tables know "
            f"{sorted(HF_MODEL_TYPES)}"
        )
    family = HF_MODEL_TYPES[hf_type]
    if model_type_hf is None:
        model_type_hf = family
    if model_type_hf not in HF_FAMILIES:
        raise ConversionError(
            f"--model-type-hf {model_type_hf!r} is not one of {sorted(HF_FAMILIES)}"
        )
    if HF_FAMILIES[model_type_hf] != family:
        raise ConversionError(
            f"--model-type-hf {model_type_hf!r} is a {HF_FAMILIES[model_type_hf]} model but the "
            f"HF config says model_type={hf_type!r}"
        )
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ConversionError(f"HF config hidden_act={act!r} is not supported (SwiGLU needs silu)")
    for key in ("attention_bias", "mlp_bias"):
        if family in ("llama", "qwen3", "qwen3_moe") and cfg.get(key):
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
    rotary_base, rope_scaling = _rope(cfg)
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
        add_qkv_bias=family == "qwen2",
        qk_layernorm=family in ("qwen3", "qwen3_moe"),
        disable_bias_linear=True,
        untie_embeddings_and_output_weights=not bool(cfg.get("tie_word_embeddings", False)),
        swiglu=True,
        attention_dropout=float(cfg.get("attention_dropout", 0.0) or 0.0),
        hidden_dropout=0.0,
        init_method_std=float(cfg.get("initializer_range", 0.02)),
        **(_moe_from_hf(cfg) if family == "qwen3_moe" else {}),
    )


def _moe_from_hf(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`ModelArchConfig`'s MoE fields of a Qwen3-MoE config.json (every layer sparse)."""
    if int(cfg.get("decoder_sparse_step", 1) or 1) != 1 or cfg.get("mlp_only_layers"):
        raise ConversionError(
            "HF config decoder_sparse_step / mlp_only_layers: dense layers among Qwen3-MoE's "
            "expert layers are not built yet (every layer must be sparse)"
        )
    experts = cfg.get("num_experts", cfg.get("num_local_experts"))
    if experts is None:
        raise ConversionError("HF config has no 'num_experts'")
    return {
        "num_experts": int(experts),
        "moe_ffn_hidden_size": int(_require(cfg, "moe_intermediate_size")),
        "moe_router_topk": int(_require(cfg, "num_experts_per_tok")),
        "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
        "moe_aux_loss_coeff": float(cfg.get("router_aux_loss_coef", 0.0) or 0.0),
    }


def _moe_to_hf(arch: ModelArchConfig) -> dict[str, Any]:
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


def hf_config_from_arch(arch: ModelArchConfig, *, dtype: str = "float32") -> dict[str, Any]:
    """A config.json dict transformers loads as the HF twin of `arch` (for mcore -> HF exports
    when no original HF config is at hand). `dtype` is a torch dtype name (float32, bfloat16)."""
    if arch.family == "qwen2" and not arch.add_qkv_bias:
        raise ConversionError("a qwen2 model without add_qkv_bias has no HF Qwen2 equivalent")
    if arch.family != "qwen2" and arch.add_qkv_bias:
        raise ConversionError(f"a {arch.family} model with add_qkv_bias has no HF equivalent")
    if arch.qk_layernorm != (arch.family in ("qwen3", "qwen3_moe")):
        raise ConversionError(
            f"a {arch.family} model with qk_layernorm={arch.qk_layernorm} has no HF equivalent "
            "(q/k layernorm is Qwen3's: model_type_hf qwen3)"
        )
    if not arch.disable_bias_linear or not arch.swiglu:
        raise ConversionError("only bias-free SwiGLU models (disable_bias_linear, swiglu) export")
    rope_scaling = arch.rope_scaling_hf()
    extra: dict[str, Any] = {"rope_scaling": rope_scaling} if rope_scaling else {}
    if arch.family == "qwen2":
        from transformers import Qwen2Config as ConfigCls
    elif arch.family == "qwen3":
        from transformers import Qwen3Config as ConfigCls
    elif arch.family == "qwen3_moe":
        from transformers import Qwen3MoeConfig as ConfigCls

        extra.update(_moe_to_hf(arch))
    else:
        from transformers import LlamaConfig as ConfigCls
    config = ConfigCls(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.ffn_hidden_size,
        num_hidden_layers=arch.num_layers,
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
        **extra,
    )
    out = config.to_dict()
    out["architectures"] = [HF_ARCHITECTURES[arch.family]]
    return out
