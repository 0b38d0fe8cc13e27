"""Tiny random DeepSeek-V3 and Qwen2-MoE HF folders built at run time (transformers' own classes,
mindrl's seeded init), for the converter and logits tests of those families."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# DeepSeek-V3's features at toy sizes: a q latent and a kv latent (TP-divisible with the RoPE
# key), YaRN, one dense layer then MoE layers of 8 experts in 4 groups (2 groups kept, top-4),
# a shared expert, sigmoid routing with a random expert bias, scaled probabilities.
DEEPSEEK_FIELDS: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    routed_scaling_factor=2.5,
    kv_lora_rank=24,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    v_head_dim=16,
    qk_nope_head_dim=16,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=4,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    topk_method="noaux_tc",  # as DeepSeek-V3's config.json: vLLM reads these two
    scoring_func="sigmoid",
    max_position_embeddings=256,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    tie_word_embeddings=False,
    num_nextn_predict_layers=0,
)

QWEN2_MOE_FIELDS: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=False,
    max_position_embeddings=256,
    use_sliding_window=False,
    tie_word_embeddings=False,
)


def build_tiny_hf(out: Path, family: str, seed: int = 0, **changes: Any) -> Path:
    """Write a random tiny `family` ("deepseek_v3" / "qwen2_moe") HF folder to `out`."""
    import torch
    import transformers

    from mindrl.assets.models import init_tiny_weights

    if family == "deepseek_v3":
        config = transformers.DeepseekV3Config(**{**DEEPSEEK_FIELDS, **changes})
        model: Any = transformers.DeepseekV3ForCausalLM(config)
    else:
        config = transformers.Qwen2MoeConfig(**{**QWEN2_MOE_FIELDS, **changes})
        model = transformers.Qwen2MoeForCausalLM(config)
    model = model.to(torch.float32)
    init_tiny_weights(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # the expert bias is a buffer: random too, so a wrong map shows
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.05 * torch.randn(buf.shape, generator=gen))
    model.save_pretrained(out, safe_serialization=True)
    return out
