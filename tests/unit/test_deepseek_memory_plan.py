"""The memory plan of MindSpeed-RL's DeepSeek-V3 model file (configs/model/deepseekv3_671b.yaml's
architecture keys, written here): its parameter count is the published 671B of the main model
(MTP layers aside), the dense first layers sit on the first pipeline stage, and its KV cache
is MLA's compressed latent on vLLM."""

from __future__ import annotations

import pytest

from mindrl.config.model_arch import ModelArchConfig
from mindrl.planning.engine import kv_bytes_per_token
from mindrl.planning.params import layer_params, model_params, stage_params

DEEPSEEK_V3_671B = ModelArchConfig(
    model_type_hf="deepseek_v3",
    num_layers=61,
    num_experts=256,
    moe_ffn_hidden_size=2048,
    ffn_hidden_size=18432,
    num_attention_heads=128,
    hidden_size=7168,
    vocab_size=129280,
    max_position_embeddings=163840,
    multi_latent_attention=True,
    qk_pos_emb_head_dim=64,
    qk_head_dim=128,
    q_lora_rank=1536,
    kv_lora_rank=512,
    v_head_dim=128,
    qk_layernorm=True,
    first_k_dense_replace=3,
    moe_layer_freq=1,
    n_shared_experts=1,
    moe_router_topk=8,
    moe_router_num_groups=8,
    moe_router_group_topk=4,
    moe_router_topk_scaling_factor=2.5,
    norm_topk_prob=True,
    moe_router_score_function="sigmoid",
    moe_router_enable_expert_bias=True,
    rope_scaling_type="yarn",
    rope_scaling_factor=40,
    rope_scaling_mscale_all_dim=1.0,
    rope_scaling_original_max_position_embeddings=4096,
)


def test_the_671b_model_has_its_published_size():
    arch = DEEPSEEK_V3_671B
    assert not arch.mla_problems() and not arch.moe_problems() and not arch.rope_scaling_problems()
    assert model_params(arch) == pytest.approx(671e9, rel=0.005)


def test_dense_layers_are_counted_where_they_sit():
    arch = DEEPSEEK_V3_671B
    dense, moe = layer_params(arch, 1, 1, 0), layer_params(arch, 1, 1, 3)
    assert dense < moe  # at EP 1 a MoE layer holds all 256 experts
    first = stage_params(arch, 1, 8, 0, ep=64, layers=8).total
    later = stage_params(arch, 1, 8, 1, ep=64, layers=8, first_layer=8).total
    embedding = arch.padded_vocab_size(1) * arch.hidden_size
    # stage 0: 3 dense + 5 MoE layers and the embedding; stage 1: 8 MoE layers
    ep64_moe = layer_params(arch, 1, 64, 3)
    assert first - embedding == 3 * dense + 5 * ep64_moe
    assert later == 8 * ep64_moe


def test_mla_kv_cache_is_the_compressed_latent_on_vllm_and_full_heads_on_hf():
    arch = DEEPSEEK_V3_671B
    assert kv_bytes_per_token(arch, 2, infer_tp=8) == 61 * (512 + 64) * 2
    assert kv_bytes_per_token(arch, 2, 1, engine="hf") == 61 * 128 * (128 + 64 + 128) * 2
