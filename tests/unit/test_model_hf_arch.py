"""HF config.json <-> ModelArchConfig."""

from __future__ import annotations

import json

import pytest

from mindrl.checkpoint.errors import ConversionError
from mindrl.models.hf_arch import arch_from_hf_config, hf_config_from_arch

QWEN = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


def test_qwen25_05b_config():
    arch = arch_from_hf_config(QWEN, model_type_hf="qwen25")
    assert arch.family == "qwen2" and arch.model_type_hf == "qwen25"
    assert (arch.num_layers, arch.hidden_size, arch.ffn_hidden_size) == (24, 896, 4864)
    assert (arch.num_attention_heads, arch.num_kv_heads, arch.head_dim) == (14, 2, 64)
    assert arch.group_query_attention and arch.add_qkv_bias and arch.tie_word_embeddings
    assert arch.rotary_base == 1e6 and arch.norm_epsilon == 1e-6
    assert arch.padded_vocab_size(1) == 151936  # HF rows are kept as they are


def test_transformers5_rope_parameters_and_llama(tmp_path):
    cfg = dict(QWEN, model_type="llama", tie_word_embeddings=False, head_dim=128)
    del cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = arch_from_hf_config(tmp_path)
    assert arch.family == "llama" and not arch.add_qkv_bias
    assert arch.rotary_base == 500000.0 and arch.head_dim == 128 and not arch.tie_word_embeddings


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"model_type": "mixtral"}, "mixtral"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_unsupported_features_are_named(change, needle):
    with pytest.raises(ConversionError, match=needle):
        arch_from_hf_config({**QWEN, **change})


def test_model_type_hf_must_match_family():
    with pytest.raises(ConversionError, match="--model-type-hf 'llama2'"):
        arch_from_hf_config(QWEN, model_type_hf="llama2")


def test_missing_or_corrupt_config(tmp_path):
    with pytest.raises(ConversionError, match="does not exist"):
        arch_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConversionError, match="not valid JSON"):
        arch_from_hf_config(tmp_path)


def test_generated_config_reads_back_to_the_same_arch():
    arch = arch_from_hf_config(QWEN, model_type_hf="qwen2")
    back = arch_from_hf_config(hf_config_from_arch(arch, dtype="bfloat16"))
    fields = (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "num_kv_heads",
        "head_dim",
        "vocab_size",
        "rotary_base",
        "norm_epsilon",
        "add_qkv_bias",
        "tie_word_embeddings",
    )
    assert {f: getattr(back, f) for f in fields} == {f: getattr(arch, f) for f in fields}


def test_a_deepseek_export_names_the_rope_width_as_head_dim():
    """transformers' DeepSeek-V3 rotates `head_dim` dims of each query / key head: the RoPE
    part (qk_rope_head_dim), not hidden / heads (7168 / 128 = 56 against 64 on DeepSeek-V3)."""
    from mindrl.config.model_arch import ModelArchConfig

    arch = ModelArchConfig(
        model_type_hf="deepseek_v3",
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=96,
        num_attention_heads=4,
        vocab_size=128,
        max_position_embeddings=64,
        multi_latent_attention=True,
        q_lora_rank=24,
        kv_lora_rank=32,
        qk_head_dim=16,
        qk_pos_emb_head_dim=8,
        v_head_dim=16,
        qk_layernorm=True,
        num_experts=4,
        moe_router_topk=2,
        moe_ffn_hidden_size=32,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
    )
    config = hf_config_from_arch(arch)
    assert (config["head_dim"], config["qk_rope_head_dim"]) == (8, 8)
    back = arch_from_hf_config(config)
    assert (back.qk_head_dim, back.qk_pos_emb_head_dim, back.v_head_dim) == (16, 8, 16)
    assert (back.q_lora_rank, back.kv_lora_rank) == (24, 32)
