"""The doctor's rollout-engine check, run in a Ray task on one device: start the engine the run
would use on the tiny model, generate greedily, reload every weight from the checkpoint, sleep
and wake where the platform can; each later generation must repeat the first one's tokens."""

from __future__ import annotations

import time
from typing import Any

PROMPTS = [[1, 17, 42, 99, 2, 1], [1, 230, 7, 2, 1]]  # token ids of the tiny tokenizer
NEW_TOKENS = 8


def run_engine_probe(accelerator: str, backend: str, memory_share: float) -> dict[str, Any]:
    """`backend`: "vllm" or "hf". Returns the steps taken, their seconds and the tokens."""
    from safetensors.torch import load_file

    from mindrl.assets.models import tiny_model_dir
    from mindrl.rollout.base import RolloutEngine, RolloutSampling

    model_dir = tiny_model_dir()
    dtype = "float32" if accelerator == "cpu" else "bfloat16"
    steps: dict[str, float] = {}
    start = time.perf_counter()
    engine: RolloutEngine
    if backend == "vllm":
        from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

        options = VLLMEngineOptions(
            dtype=dtype,
            max_model_len=128,
            max_num_seqs=4,
            max_num_batched_tokens=128,
            gpu_memory_utilization=memory_share,
            cpu_kv_cache_bytes=64 << 20,
        )
        engine = VLLMRolloutEngine(model_dir, options, accelerator=accelerator)
        sleeps = engine.sleep_supported or engine.host_sleep
    else:
        from mindrl.rollout.hf_engine import HFRolloutEngine

        engine = HFRolloutEngine(model_dir, dtype=dtype, seed=0)
        sleeps = True
    steps["start"] = time.perf_counter() - start
    greedy = RolloutSampling(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    try:
        t = time.perf_counter()
        first = [r.token_ids for r in engine.generate(PROMPTS, greedy)]
        steps["generate"] = time.perf_counter() - t
        t = time.perf_counter()
        weights = load_file(str(model_dir / "model.safetensors"))
        engine.update_weights(weights.items())
        after_reload = [r.token_ids for r in engine.generate(PROMPTS, greedy)]
        steps["reload"] = time.perf_counter() - t
        after_wake = None
        if sleeps:
            t = time.perf_counter()
            engine.sleep(1)
            engine.wake_up()
            after_wake = [r.token_ids for r in engine.generate(PROMPTS, greedy)]
            steps["sleep_wake"] = time.perf_counter() - t
    finally:
        engine.close()
    return {
        "backend": backend,
        "steps_s": steps,
        "sleep_wake": sleeps,
        "tokens": first,
        "same_after_reload": after_reload == first,
        "same_after_wake": after_wake == first if after_wake is not None else None,
    }
