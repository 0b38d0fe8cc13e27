"""Tiny random Qwen2 / Llama models, built from code: every argument set gives bit-identical
HF folders, cached under a hash of the arguments."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.assets.cache import assets_root, build_atomically
from mindrl.assets.tokenizer import TINY_TOKENIZER_SIZE, build_tiny_tokenizer, tiny_token_ids
from mindrl.models.dtypes import dtype_long_name

if TYPE_CHECKING:
    import torch

# Bump when the bytes a builder writes change, so stale cached folders are not reused.
TINY_BUILD_VERSION = 1


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that determines a tiny model's bytes; its hash names the cache folder."""

    family: str = "qwen2"
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

    def resolved(self) -> TinyModelSpec:
        """Fill defaults that depend on other fields and validate the combination."""
        if self.family not in ("qwen2", "llama"):
            raise ValueError(f"family must be 'qwen2' or 'llama', got {self.family!r}")
        qkv_bias = self.family == "qwen2" if self.qkv_bias is None else bool(self.qkv_bias)
        if qkv_bias != (self.family == "qwen2"):
            # Qwen2ForCausalLM always has q/k/v biases; Llama's attention_bias also adds an
            # o_proj bias, which is not the qkv-bias layout, so neither combination exists.
            raise ValueError(f"family {self.family!r} requires qkv_bias={not qkv_bias}")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        head_dim = self.hidden_size // self.num_heads
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
        resolved = {"vocab_size": vocab, "qkv_bias": qkv_bias, "dtype": dtype}
        return TinyModelSpec(**{**asdict(self), **resolved})

    def key(self) -> str:
        """Short stable hash of the resolved spec and the builder version."""
        payload = json.dumps(
            {"build": TINY_BUILD_VERSION, **asdict(self.resolved())}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def tiny_model_config(spec: TinyModelSpec | None = None, **variant: Any):
    """The HF config (``Qwen2Config`` or ``LlamaConfig``) of a tiny model variant."""
    spec = (spec or TinyModelSpec(**variant)).resolved()
    ids = tiny_token_ids()
    common = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.ffn_hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        hidden_act="silu",
        max_position_embeddings=512,
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
    if spec.family == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(use_sliding_window=False, **common)
    from transformers import LlamaConfig

    return LlamaConfig(attention_bias=False, mlp_bias=False, **common)


_EMBED_STD = 0.05


def _init_weights(model, seed: int) -> None:
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
                value = noise / param.shape[1] ** 0.5
            param.copy_(value.to(param.dtype))


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    family: str = "qwen2",
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
) -> Path:
    """Write an HF folder of a random-init tiny ``Qwen2ForCausalLM`` / ``LlamaForCausalLM``.

    The folder holds config.json, model.safetensors, generation_config.json and the tiny
    tokenizer; the same arguments give bit-identical files. ``vocab_size`` defaults to the
    tokenizer size rounded up to a multiple of 64 (rows past the tokenizer are padding, as
    in Qwen's checkpoints).
    """
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM, Qwen2ForCausalLM

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
    ).resolved()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_model_config(spec)
    model_cls = Qwen2ForCausalLM if spec.family == "qwen2" else LlamaForCausalLM
    model = model_cls(config).to(torch.float32)
    _init_weights(model, spec.seed)
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
