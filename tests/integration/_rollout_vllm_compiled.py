"""Run by test_rollout_vllm.py through the `fresh_process` fixture: a weight sync into a vLLM
engine in compiled mode (`enforce_eager=False`: torch.compile'd model, CUDA-graph-free on
CPU), which the SmolLM2 CPU config uses. A compiled graph that kept references to the
loaded weights or GEMM handles would go on sampling the old model after a sync.

Builds the compiled engine on `model_dir`, streams `new_dir`'s weights in small buckets (the
direct path on CPU, fused layers split across calls), then generates greedily.
Arguments: {"model_dir", "new_dir", "prompts": [[ids]]}. Result: {"before", "after":
[{"tokens", "logprobs"}] per prompt}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from mindrl.rollout import RolloutSampling, iter_buckets
from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine
from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    options = VLLMEngineOptions(
        dtype="float32", max_model_len=256, max_num_seqs=16, seed=0, enforce_eager=False
    )
    engine = VLLMRolloutEngine(args["model_dir"], options, accelerator="cpu")
    greedy = RolloutSampling(temperature=0, max_tokens=16)

    def generate() -> list[dict[str, Any]]:
        results = engine.generate(args["prompts"], greedy)
        return [{"tokens": list(r.token_ids), "logprobs": list(r.logprobs)} for r in results]

    try:
        before = generate()
        new = load_file(str(Path(args["new_dir"]) / "model.safetensors"))
        for bucket in iter_buckets(sorted(new.items()), 48 << 10):
            engine.update_weights(bucket)
        return {"before": before, "after": generate()}
    finally:
        engine.close()


if __name__ == "__main__":
    json_main(main)
