"""Tiny random models of any registered family (Qwen2 / Llama / Qwen3 / Qwen3-MoE, a
Llama-3.1-style preset, and families registered at run time), built from code with transformers'
own config and model classes as the family module names them: every argument set gives
bit-identical HF folders, cached under a hash of the arguments."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.assets.cache import assets_root, build_atomically
from mindrl.assets.tokenizer import TINY_TOKENIZER_SIZE, build_tiny_tokenizer, tiny_token_ids
from mindrl.families import registry
from mindrl.families.llama import LLAMA
from mindrl.families.qwen2 import QWEN2
from mindrl.families.qwen3 import QWEN3
from mindrl.families.qwen3_moe import QWEN3_MOE
from mindrl.families.spec import FamilySpec
from mindrl.models.dtypes import dtype_long_name

if TYPE_CHECKING:
    import torch

# Bump when the bytes a builder writes change, so stale cached folders are not reused.
TINY_BUILD_VERSION = 1

# Fields left out of the hash at their default, so folders built before they existed are reused.
_HASH_OPTIONAL = ("head_dim", "num_experts", "moe_ffn_hidden_size", "moe_topk", "max_positions")
# llama31: Llama with Llama 3.1's rope scaling, its parameters chosen so that, at head_dim 32,
# some frequencies stay, one is interpolated and the rest are divided by the factor.
TINY_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 2.0,
    "original_max_position_embeddings": 128,
}
# Tiny presets that are a family plus HF config fields (not families of their own).
TINY_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama31": (LLAMA.name, {"rope_scaling": TINY_LLAMA3_ROPE}),
}


def tiny_families() -> tuple[str, ...]:
    """What `TinyModelSpec.family` accepts: the registered families and the presets."""
    return (*registry.built_names(), *TINY_PRESETS)


def _family_of(name: str) -> tuple[FamilySpec, dict[str, Any]]:
    """The family spec of a tiny family name and the preset's extra HF config fields."""
    family, extra = TINY_PRESETS.get(name, (name, {}))
    spec = registry.built_family(family)
    if spec is None:
        raise ValueError(f"family must be one of {tiny_families()}, got {name!r}")
    return spec, dict(extra)


@dataclass(frozen=True)
class _TinyExperts:
    """The MoE fields a family's `hf_fields_from_arch` reads, for a tiny model."""

    num_experts: int
    moe_router_topk: int
    expert_ffn_hidden_size: int
    norm_topk_prob: bool = True
    moe_aux_loss_coeff: float = 0.001


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that determines a tiny model's bytes; its hash names the cache folder."""

    family: str = QWEN2.name  # a registered family or a TINY_PRESETS name
    vocab_size: int | None = None
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    ffn_hidden_size: int = 256
    qkv_bias: bool | None = None
    tie_word_embeddings: bool = True
    seed: int = 0
    dtype: str = "float32"
    head_dim: int | None = None  # None: hidden_size / num_heads (left out of the hash)
    num_experts: int | None = None  # qwen3_moe: routed experts per layer
    moe_ffn_hidden_size: int | None = None  # qwen3_moe: each expert's ffn size
    moe_topk: int | None = None  # qwen3_moe: experts per token
    max_positions: int | None = None  # max_position_embeddings; None: 512 (left out of the hash)

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    def resolved(self) -> TinyModelSpec:
        """Fill defaults that depend on other fields and validate the combination."""
        features = _family_of(self.family)[0].features
        qkv_bias = features.qkv_bias if self.qkv_bias is None else bool(self.qkv_bias)
        if qkv_bias != features.qkv_bias:
            # Qwen2ForCausalLM always has q/k/v biases; Llama's attention_bias also adds an
            # o_proj bias, which is not the qkv-bias layout, so neither combination exists.
            raise ValueError(f"family {self.family!r} requires qkv_bias={not qkv_bias}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads (or set head_dim)")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        head_dim = self.dim
        if head_dim < 32:
            raise ValueError(f"head_dim={head_dim} < 32: vLLM's CPU attention needs >= 32")
        vocab = self.vocab_size
        if vocab is None:
            vocab = -(-TINY_TOKENIZER_SIZE // 64) * 64
        if vocab < TINY_TOKENIZER_SIZE:
            raise ValueError(
                f"vocab_size={vocab} is smaller than the tokenizer ({TINY_TOKENIZER_SIZE})"
            )
        dtype = dtype_long_name(self.dtype)
        resolved: dict[str, Any] = {"vocab_size": vocab, "qkv_bias": qkv_bias, "dtype": dtype}
        if features.moe != (self.num_experts is not None):
            moe = [s.name for s in registry.built_families() if s.features.moe]
            raise ValueError(f"num_experts is set for family {' / '.join(moe)}, and only for it")
        if self.num_experts is not None:
            resolved["moe_ffn_hidden_size"] = self.moe_ffn_hidden_size or self.ffn_hidden_size
            resolved["moe_topk"] = self.moe_topk or 2
        return TinyModelSpec(**{**asdict(self), **resolved})

    def key(self) -> str:
        """Short stable hash of the resolved spec and the builder version."""
        fields = asdict(self.resolved())
        for name in _HASH_OPTIONAL:
            if fields[name] is None:
                del fields[name]  # the hashes of models built before the field existed
        payload = json.dumps({"build": TINY_BUILD_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def tiny_model_config(spec: TinyModelSpec | None = None, **variant: Any) -> Any:
    """The HF config of a tiny model: the transformers config class its family module names
    (``Qwen2Config``, ``LlamaConfig``, ``Qwen3Config``, ``Qwen3MoeConfig``, ...)."""
    import transformers

    spec = (spec or TinyModelSpec(**variant)).resolved()
    family, preset = _family_of(spec.family)
    ids = tiny_token_ids()
    fields: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.ffn_hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.dim,
        hidden_act="silu",
        max_position_embeddings=spec.max_positions or 512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        initializer_range=0.02,
        use_cache=True,
        dtype=spec.dtype,
    )
    fields.update(preset)
    fields.update(family.tiny_hf_fields)
    if spec.num_experts is not None:
        experts = _TinyExperts(
            num_experts=spec.num_experts,
            moe_router_topk=spec.moe_topk or 2,
            expert_ffn_hidden_size=spec.moe_ffn_hidden_size or spec.ffn_hidden_size,
        )
        fields.update(family.hf_fields_from_arch(experts))
    return getattr(transformers, family.hf_config_class)(**fields)


_EMBED_STD = 0.05


def init_tiny_weights(model, seed: int) -> None:
    """Seeded init, independent of transformers' own init order.

    Block matrices get std 1/sqrt(fan_in), embeddings std 0.05, norm weights 1 + 0.1 noise.
    With the usual 0.02 everywhere the residual stream is the embedding itself, so tied
    weights make "repeat the input token" the argmax and the logits nearly flat (std ~0.2);
    these give logits with std ~0.5 and greedy continuations that vary.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith("bias"):
                value = 0.02 * noise
            elif "embed_tokens" in name or "lm_head" in name:
                value = _EMBED_STD * noise
            else:
                value = noise / param.shape[-1] ** 0.5  # fan-in (experts: [E, out, in])
            param.copy_(value.to(param.dtype))


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    family: str = QWEN2.name,
    vocab_size: int | None = None,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    ffn_hidden_size: int = 256,
    qkv_bias: bool | None = None,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    dtype: str | torch.dtype = "float32",
    head_dim: int | None = None,
    num_experts: int | None = None,
    moe_ffn_hidden_size: int | None = None,
    moe_topk: int | None = None,
    max_positions: int | None = None,
) -> Path:
    """Write an HF folder of a random-init tiny model of `family` (its family module's HF
    class: ``Qwen2ForCausalLM`` for qwen2, ``LlamaForCausalLM`` for llama or llama31, ...).

    The folder holds config.json, model.safetensors, generation_config.json and the tiny
    tokenizer; the same arguments give bit-identical files. ``vocab_size`` defaults to the
    tokenizer size rounded up to a multiple of 64 (rows past the tokenizer are padding, as
    in Qwen's checkpoints).
    """
    import torch
    import transformers
    from transformers import GenerationConfig

    spec = TinyModelSpec(
        family=family,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        ffn_hidden_size=ffn_hidden_size,
        qkv_bias=qkv_bias,
        tie_word_embeddings=tie_word_embeddings,
        seed=seed,
        dtype=dtype_long_name(dtype),
        head_dim=head_dim,
        num_experts=num_experts,
        moe_ffn_hidden_size=moe_ffn_hidden_size,
        moe_topk=moe_topk,
        max_positions=max_positions,
    ).resolved()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_model_config(spec)
    model_cls = getattr(transformers, _family_of(spec.family)[0].hf_architecture)
    model = model_cls(config).to(torch.float32)
    init_tiny_weights(model, spec.seed)
    model = model.to(getattr(torch, spec.dtype))
    model.save_pretrained(out, safe_serialization=True)
    ids = tiny_token_ids()
    GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    ).save_pretrained(out)
    build_tiny_tokenizer(out)
    return out


def tiny_model_dir(**variant: Any) -> Path:
    """Cached :func:`build_tiny_model` folder for ``variant`` (same keyword arguments)."""
    spec = TinyModelSpec(**{**variant, "dtype": dtype_long_name(variant.get("dtype", "float32"))})
    target = assets_root() / f"tiny-{spec.key()}"
    return build_atomically(target, lambda tmp: build_tiny_model(tmp, **asdict(spec)))


def tiny_qwen3_dir() -> Path:
    """Tiny Qwen3ForCausalLM: q/k norm, head_dim 64 (not hidden / heads = 32), tied embeddings
    (as Qwen3-0.6B), the tiny tokenizer's 448 rows: `${asset:tiny_qwen3}`."""
    return tiny_model_dir(family=QWEN3.name, head_dim=64)


def tiny_llama31_dir() -> Path:
    """Tiny Llama-3.1-style LlamaForCausalLM: llama3 rope scaling (TINY_LLAMA3_ROPE), untied
    embeddings (as Llama-3.1-8B): `${asset:tiny_llama31}`."""
    return tiny_model_dir(family="llama31", tie_word_embeddings=False)


def tiny_qwen3_moe_dir() -> Path:
    """Tiny Qwen3MoeForCausalLM: 8 experts of ffn 64, top-2 with renormalised probabilities
    (norm_topk_prob, as Qwen3-30B-A3B), q/k norm, head_dim 32, untied embeddings:
    `${asset:tiny_qwen3_moe}`."""
    return tiny_model_dir(
        family=QWEN3_MOE.name,
        num_experts=8,
        moe_ffn_hidden_size=64,
        moe_topk=2,
        tie_word_embeddings=False,
    )


def tiny_long_dir() -> Path:
    """The tiny Qwen2 with 16k positions, for responses of thousands of tokens (context
    parallel on CPU): `${asset:tiny_long}`."""
    return tiny_model_dir(max_positions=16384)


# `${asset:NAME}` names of the tiny models (mindrl.config.resolvers).
TINY_ASSETS: dict[str, Callable[[], Path]] = {
    "tiny": tiny_model_dir,
    "tiny_long": tiny_long_dir,
    "tiny_qwen3": tiny_qwen3_dir,
    "tiny_llama31": tiny_llama31_dir,
    "tiny_qwen3_moe": tiny_qwen3_moe_dir,
}
