"""Qwen3-MoE at config time: the shipped model files carry the published architectures, the
MoE keys each have a fate (honoured, handed to MindSpeed, no effect, or refused naming the
DeepSeek / Qwen2-MoE feature not built), HF config.json maps to `ModelArchConfig` and back,
and the routing / dispatcher / balance-loss keys reach megatron-core's TransformerConfig."""

from __future__ import annotations

import pytest

from mindrl.checkpoint.errors import ConversionError
from mindrl.checkpoint.mapping import Split, bound_rules
from mindrl.config import ConfigError
from mindrl.config.fates import Handed, NoEffect, Refused
from mindrl.config.megatron_features import MoEConfig
from mindrl.config.model_arch import ModelArchConfig
from mindrl.models.gpt import validate_parallel_layout
from mindrl.models.hf_arch import arch_from_hf_config, hf_config_from_arch
from mindrl.models.moe import moe_transformer_kwargs
from tests.unit.test_qwen3_llama31_config import _arch, _billions

# HF config.json of Qwen3-30B-A3B (architecture keys).
QWEN3_30B_A3B_HF = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "router_aux_loss_coef": 0.001,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "heads", "expert_ffn", "billions"),
    [
        ("qwen3_30b_a3b", 48, 2048, 32, 768, 30.53),  # model cards: 30.5B and 235B total
        ("qwen3_235b_a22b", 94, 4096, 64, 1536, 235.09),
    ],
)
def test_qwen3_moe_model_files_are_the_published_architectures(
    name, layers, hidden, heads, expert_ffn, billions
):
    arch = _arch(name)
    assert (arch.family, arch.qk_layernorm, arch.is_moe) == ("qwen3_moe", True, True)
    assert (arch.num_layers, arch.hidden_size, arch.num_attention_heads) == (layers, hidden, heads)
    assert (arch.num_kv_heads, arch.head_dim, arch.tie_word_embeddings) == (4, 128, False)
    assert (arch.num_experts, arch.moe_router_topk, arch.moe_ffn_hidden_size) == (
        128,
        8,
        expert_ffn,
    )
    assert arch.norm_topk_prob and arch.vocab_size == 151936 and arch.rotary_base == 1e6
    assert _billions(arch) == pytest.approx(billions, abs=0.05)


def test_hf_config_maps_to_the_arch_and_back():
    arch = arch_from_hf_config(QWEN3_30B_A3B_HF)
    shipped = _arch("qwen3_30b_a3b")
    same = (
        "num_experts",
        "moe_ffn_hidden_size",
        "moe_router_topk",
        "norm_topk_prob",
        "kv_channels",
    )
    assert [getattr(arch, k) for k in same] == [getattr(shipped, k) for k in same]
    assert (arch.num_experts, arch.moe_ffn_hidden_size, arch.moe_router_topk) == (128, 768, 8)
    assert arch.norm_topk_prob and arch.moe_aux_loss_coeff == 0.001
    back = hf_config_from_arch(arch)
    assert back["architectures"] == ["Qwen3MoeForCausalLM"]
    assert arch_from_hf_config(back) == arch
    # transformers' Qwen3MoeConfig may name the expert count num_local_experts
    renamed = {k: v for k, v in QWEN3_30B_A3B_HF.items() if k != "num_experts"}
    assert arch_from_hf_config({**renamed, "num_local_experts": 128}) == arch


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"decoder_sparse_step": 2}, "dense layers among Qwen3-MoE"),
        ({"mlp_only_layers": [0]}, "dense layers among Qwen3-MoE"),
        ({"attention_bias": True}, "attention_bias=true"),
    ],
)
def test_what_is_not_built_is_refused(change, needle):
    with pytest.raises(ConversionError, match=needle):
        arch_from_hf_config({**QWEN3_30B_A3B_HF, **change})


def test_mapping_routes_each_expert_to_its_global_index():
    arch = arch_from_hf_config({**QWEN3_30B_A3B_HF, "num_hidden_layers": 1})
    rules = {b.mcore: b for b in bound_rules(arch)}
    router = rules["decoder.layers.0.mlp.router.weight"]
    assert (router.hf, router.hf_shapes, router.split) == (
        ("model.layers.0.mlp.gate.weight",),
        ((128, 2048),),
        Split.REPLICATED,
    )
    fc1 = rules["decoder.layers.0.mlp.experts.local_experts.127.linear_fc1.weight"]
    assert fc1.hf == (
        "model.layers.0.mlp.experts.127.gate_proj.weight",
        "model.layers.0.mlp.experts.127.up_proj.weight",
    )
    assert fc1.split is Split.GATE_UP and fc1.hf_shapes == ((768, 2048), (768, 2048))
    fc2 = rules["decoder.layers.0.mlp.experts.local_experts.5.linear_fc2.weight"]
    assert (fc2.hf, fc2.split) == (("model.layers.0.mlp.experts.5.down_proj.weight",), Split.ROW)
    assert not any("mlp.linear_fc" in name for name in rules)  # no dense MLP


@pytest.mark.parametrize(("norm", "pre_softmax"), [(True, False), (False, True)])
def test_routing_and_balance_keys_reach_the_transformer_config(norm, pre_softmax):
    import dataclasses

    arch = dataclasses.replace(
        arch_from_hf_config(QWEN3_30B_A3B_HF),
        norm_topk_prob=norm,
        moe_token_dispatcher_type="alltoall_seq",
        moe_z_loss_coeff=0.01,
    )
    kwargs = moe_transformer_kwargs(arch, expert_parallel_size=4)
    assert kwargs["moe_router_pre_softmax"] is pre_softmax
    assert kwargs["moe_token_dispatcher_type"] == "alltoall"  # MindSpeed's alltoall_seq
    assert (kwargs["num_moe_experts"], kwargs["moe_router_topk"]) == (128, 8)
    assert (kwargs["moe_aux_loss_coeff"], kwargs["moe_z_loss_coeff"]) == (0.001, 0.01)
    assert kwargs["expert_model_parallel_size"] == 4 and kwargs["moe_grouped_gemm"] is False
    off = dataclasses.replace(arch, moe_router_load_balancing_type="none")
    assert moe_transformer_kwargs(off, 1)["moe_aux_loss_coeff"] == 0.0
    assert moe_transformer_kwargs(_arch("qwen3_8b"), 1) == {}


def test_expert_parallel_must_divide_the_experts():
    arch = arch_from_hf_config(QWEN3_30B_A3B_HF)
    validate_parallel_layout(arch, 4, 4, 8)
    with pytest.raises(ValueError, match="--target-expert-parallel-size 3 does not divide"):
        validate_parallel_layout(arch, 1, 1, 3)
    with pytest.raises(ValueError, match="needs a MoE model"):
        validate_parallel_layout(_arch("qwen3_8b"), 1, 1, 2)


def test_every_moe_key_has_a_fate():
    import dataclasses

    fates = {f.name: f.metadata.get("fate") for f in dataclasses.fields(MoEConfig)}
    assert fates["expert_model_parallel_size"] is None  # honoured (parallel state, builder)
    assert isinstance(fates["moe_tp_extend_ep"], NoEffect)
    for key in ("moe_grouped_gemm", "moe_permutation_async_comm", "moe_alltoall_overlap_comm"):
        assert isinstance(fates[key], Handed), key
    assert isinstance(fates["seq_aux"], Refused)
    arch_keys = {f.name for f in dataclasses.fields(ModelArchConfig)}
    for key in ("n_shared_experts", "first_k_dense_replace", "moe_router_num_groups"):
        assert key in arch_keys and key not in fates, key  # built: DeepSeek-V3 / Qwen2-MoE


def test_mindspeed_rl_moe_keys_load_and_unbuilt_ones_are_refused():
    arch = _arch(
        "qwen3_30b_a3b",
        "++actor_config.moe_grouped_gemm=true",
        "++actor_config.moe_tp_extend_ep=true",
        "++actor_config.moe_permutation_async_comm=true",
        "++actor_config.moe_token_dispatcher_type=alltoall_seq",
    )
    assert arch.moe_token_dispatcher_type == "alltoall_seq"
    with pytest.raises(ConfigError, match="shared experts.: the Qwen3-MoE family has none"):
        _arch("qwen3_30b_a3b", "++actor_config.n_shared_experts=1")


def test_memory_plan_counts_the_experts_and_splits_them_over_ep():
    from mindrl.planning.params import model_params, stage_params

    arch = _arch("qwen3_30b_a3b")
    assert model_params(arch) == pytest.approx(_billions(arch) * 1e9, rel=1e-6)
    ep1 = stage_params(arch, 1, 1, 0).total
    ep8 = stage_params(arch, 1, 1, 0, ep=8).total
    experts = arch.num_layers * 128 * 3 * 768 * 2048  # gate, up, down of every expert
    assert ep1 - ep8 == experts - experts // 8


def test_an_expert_parallel_rank_names_its_experts_locally():
    from mindrl.checkpoint.online import ExpertLayout

    layout = ExpertLayout(ep_rank=1, ep_size=2, num_local=4)
    name = "decoder.layers.3.mlp.experts.local_experts.6.linear_fc1.weight"
    assert [layout.owner(e) for e in (0, 3, 4, 7)] == [0, 0, 1, 1]
    assert layout.is_local(6) and not layout.is_local(2)
    local = layout.local_name(name, 6)
    assert local == "decoder.layers.3.mlp.experts.local_experts.2.linear_fc1.weight"
    assert layout.global_name(local) == name
    assert layout.global_name("decoder.layers.3.mlp.router.weight").endswith("router.weight")
