"""Accelerator detection and the per-device facts the rest of mindrl needs.

torch is imported lazily and torch_npu only when the device is npu, so `import mindrl`
and config validation stay cheap and the CPU path never touches torch_npu.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import random
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from mindrl.accelerator.errors import AcceleratorError

if TYPE_CHECKING:
    import torch

ACCELERATOR_NAMES = ("auto", "npu", "cuda", "cpu")


def _npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)

        return bool(torch.npu.is_available())  # type: ignore[attr-defined]
    except Exception:  # a broken CANN install must not stop CPU users
        return False


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def detect_accelerator_name() -> str:
    """npu if torch_npu sees a device, else cuda if torch does, else cpu."""
    if _npu_available():
        return "npu"
    if _cuda_available():
        return "cuda"
    return "cpu"


@dataclass(frozen=True)
class Accelerator:
    """Facts and operations for one device kind. Build it with `get_accelerator`."""

    name: str  # "npu" | "cuda" | "cpu"

    # -- static facts -------------------------------------------------------------------------
    @property
    def dist_backend(self) -> str:
        """torch.distributed backend: hccl on Ascend, nccl on NVIDIA, gloo on CPU."""
        return {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[self.name]

    @property
    def ray_resource(self) -> str:
        """Ray resource that stands for one device: NPU / GPU, or a CPU slot on a CPU box."""
        return {"npu": "NPU", "cuda": "GPU", "cpu": "CPU"}[self.name]

    @property
    def visible_devices_env(self) -> str | None:
        """Environment variable that restricts a process to its devices (None on CPU)."""
        return {"npu": "ASCEND_RT_VISIBLE_DEVICES", "cuda": "CUDA_VISIBLE_DEVICES", "cpu": None}[
            self.name
        ]

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"

    # -- runtime ------------------------------------------------------------------------------
    def worker_env(self) -> dict[str, str]:
        """Environment a compute worker process starts with (read at process start).

        On CPU the tensors are host memory: glibc serves every allocation above its mmap
        threshold (at most 32 MB) with a fresh mmap and unmaps it on free, so each training
        step re-faults gigabytes of zeroed pages, a large share of an update spent as system
        time. Keeping freed memory in the heap and backing torch's large allocations with
        transparent huge pages removes that. Values already in the environment win.
        """
        if not self.is_cpu:
            return {}
        wanted = {
            "MALLOC_MMAP_MAX_": "0",  # no per-tensor mmap/munmap
            "MALLOC_TRIM_THRESHOLD_": str(64 << 30),  # keep freed heap memory for reuse
            "THP_MEM_ALLOC_ENABLE": "1",  # torch: 2 MB-aligned, madvise(MADV_HUGEPAGE)
        }
        return {k: os.environ.get(k, v) for k, v in wanted.items()}

    def release_cached_memory(self, min_host_bytes: int = 0) -> None:
        """Give freed memory back: the caching allocator's blocks on a device (the next
        allocation may be another process's, or the engine's), glibc's free heap on CPU
        (`host_heap.trim_host_heap`; kept when less than `min_host_bytes` is free)."""
        if self.is_cpu:
            from mindrl.accelerator.host_heap import trim_host_heap

            trim_host_heap(min_host_bytes)
            return
        empty = getattr(self._torch_module(), "empty_cache", None)
        if empty is not None:
            empty()

    def device(self, local_rank: int = 0) -> torch.device:
        import torch

        if self.is_cpu:
            return torch.device("cpu")
        return torch.device(self.name, local_rank)

    def set_device(self, local_rank: int) -> None:
        """Bind this process to its device (no-op on CPU)."""
        if not self.is_cpu:
            self._torch_module().set_device(local_rank)

    def device_count(self) -> int:
        if self.is_cpu:
            return os.cpu_count() or 1
        return int(self._torch_module().device_count())

    def synchronize(self) -> None:
        if not self.is_cpu:
            self._torch_module().synchronize()

    def memory_stats(self) -> dict[str, float]:
        """Allocated / peak memory in GiB: device memory, or this process's RSS on CPU."""
        gib = float(1 << 30)
        if self.is_cpu:
            import psutil

            info = psutil.Process().memory_info()
            peak = peak_rss_bytes()
            return {"allocated_gib": info.rss / gib, "peak_gib": max(peak, info.rss) / gib}
        mod = self._torch_module()
        return {
            "allocated_gib": mod.memory_allocated() / gib,
            "peak_gib": mod.max_memory_allocated() / gib,
        }

    def seed(self, seed: int) -> None:
        """Seed python, numpy, torch and, when initialised, megatron's model-parallel RNGs."""
        import numpy as np
        import torch

        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)
        if not self.is_cpu:
            self._torch_module().manual_seed_all(seed)
        from mindrl.accelerator.megatron_shims import seed_megatron_if_initialized

        seed_megatron_if_initialized(seed)

    def apply_megatron_shims(self) -> None:
        """Make megatron-core's hard-coded CUDA calls work on this device.

        CPU: the shims in `megatron_shims`. NPU: MindSpeed's megatron adaptor, which the
        process's entry has imported before megatron (`mindspeed_args.prepare_megatron`;
        this raises if it did not). CUDA: nothing to do.
        """
        if self.is_cpu:
            from mindrl.accelerator.megatron_shims import apply_cpu_shims

            apply_cpu_shims()
        elif self.name == "npu":
            from mindrl.accelerator.mindspeed_args import prepare_megatron

            prepare_megatron(self.name)

    def _torch_module(self) -> Any:
        import torch

        return getattr(torch, self.name)


def peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM (ru_maxrss carries a parent's peak across fork/exec)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


@cache
def _build(name: str) -> Accelerator:
    if name == "npu":
        if not _npu_available():
            raise AcceleratorError(
                "accelerator 'npu' requested but torch_npu is not installed or sees no NPU "
                "(install torch-npu and CANN, or set runtime.accelerator=auto)"
            )
        import torch_npu  # noqa: F401
    elif name == "cuda":
        if not _cuda_available():
            raise AcceleratorError(
                "accelerator 'cuda' requested but torch.cuda.is_available() is False "
                "(install a CUDA build of torch, or set runtime.accelerator=auto)"
            )
    return Accelerator(name)


def accelerator_usable(name: str) -> bool:
    """Whether a run for `name` ("npu" | "cuda" | "cpu") could start on this machine.

    A dry run checks its plan against this machine (or the Ray cluster it would join) only
    when it could; otherwise it plans for the config's target without touching the device.
    """
    if name == "cpu":
        return True
    if name == "npu":
        return _npu_available()
    if name == "cuda":
        return _cuda_available()
    return False


def planning_accelerator(name: str) -> Accelerator:
    """The accelerator a placement plan is made for, never checked against this machine.

    Its static facts (Ray resource, backend) are all a plan needs, so a laptop can plan NPU
    bundles for an Ascend cluster without importing torch_npu. Not for running anything.
    """
    if name not in ACCELERATOR_NAMES or name == "auto":
        raise AcceleratorError(f"unknown accelerator {name!r}; choose one of npu, cuda, cpu")
    return Accelerator(name)


def get_accelerator(name: str = "auto") -> Accelerator:
    """The accelerator for `name` ("auto" detects: npu, then cuda, then cpu)."""
    if name not in ACCELERATOR_NAMES:
        raise AcceleratorError(f"unknown accelerator {name!r}; choose one of {ACCELERATOR_NAMES}")
    if name == "auto":
        name = os.environ.get("MINDRL_ACCELERATOR") or detect_accelerator_name()
        if name not in ACCELERATOR_NAMES or name == "auto":
            raise AcceleratorError(f"MINDRL_ACCELERATOR={name!r} is not one of npu, cuda, cpu")
    return _build(name)
