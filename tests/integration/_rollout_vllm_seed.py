"""Run by test_rollout_vllm.py through the `fresh_process` fixture: engine-seed
reproducibility across engine instances.

Builds a vLLM engine, samples twice without a per-call seed, closes it, and repeats with
the same and with another engine seed, in one fresh process (one standalone vLLM engine
per process at a time). Arguments: {"model_dir": HF_DIR}. Result: {label: [calls][results]
token ids} for labels "a" (seed 21), "b" (seed 21), "c" (seed 22).
"""

from __future__ import annotations

from typing import Any

from mindrl.rollout import RolloutSampling
from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine
from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    model_dir = args["model_dir"]
    prompts = [[1, 40, 41, 42, 2, 1], [1, 7, 8], [1, 300, 2, 1]]
    sampling = RolloutSampling(n=3, temperature=1.0, top_p=0.95, max_tokens=12)
    out = {}
    for label, seed in (("a", 21), ("b", 21), ("c", 22)):
        options = VLLMEngineOptions(dtype="float32", max_model_len=256, max_num_seqs=16, seed=seed)
        engine = VLLMRolloutEngine(model_dir, options, accelerator="cpu")
        try:
            out[label] = [
                [list(r.token_ids) for r in engine.generate(prompts, sampling)] for _ in range(2)
            ]
        finally:
            engine.close()
    return out


if __name__ == "__main__":
    json_main(main)
