"""vLLM's layerwise weight reload, limited to the layers one bucket of weights fills.

vLLM 0.32's ``reload_weights`` prepares every layer of the model for loading (its tensors
moved to the meta device, its loaders wrapped), loads what the bucket holds, then finishes
every layer again: layers the bucket did not reach are put back, each with a "Failed to load
weights" warning. A weight sync streams the model in buckets (`weight_sync_bucket_mb`), so
every bucket paid that walk over the whole model and logged a warning per untouched layer
(a model sent in three buckets: three walks, and most layers warned about on each).
Preparing and finishing only the layers named in the bucket runs the same vLLM steps on the
layers that change (each is rebuilt, its CPU GEMM handle re-packed, exactly as in a full
reload) and nothing on the rest.

`reload_layers` runs inside vLLM's worker (``collective_rpc``); its layerwise steps
(`load_layerwise`) also serve vllm-ascend 0.22/0.23's whole-model reload. vLLM is imported
inside them only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def has_layerwise_reload() -> bool:
    """Whether the installed vLLM exposes the layerwise reload steps this path uses."""
    try:
        from vllm.model_executor.model_loader.reload import (  # noqa: F401
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )
    except ImportError:
        return False
    return True


def load_layerwise(worker: Any, weights: list[tuple[str, Any]], modules: Sequence[Any]) -> None:
    """In the worker: vLLM's layerwise reload steps over `modules` (prepare each, the model's
    ``load_weights``, finish each: rebuilt and re-processed, e.g. re-packed on CPU), on the
    worker's device and under its vLLM config."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    with set_current_vllm_config(worker.vllm_config), _on_device(worker.device):
        for module in modules:
            initialize_layerwise_reload(module)
        worker.model_runner.model.load_weights(weights)
        for module in modules:
            finalize_layerwise_reload(module, worker.model_config)


def _on_device(device: Any) -> Any:
    """New tensors on the worker's device: ``torch.device(...)`` as a context (a torch
    function mode that sees every torch call of the reload, an overhead on each call), or
    nothing on CPU, where they land anyway."""
    import contextlib

    import torch

    device = torch.device(device)
    return contextlib.nullcontext() if device.type == "cpu" else device


def reload_layers(worker: Any, weights: list[tuple[str, Any]], layers: Sequence[str]) -> None:
    """In the worker: reload `weights` (HF names) into the model, preparing and finishing only
    `layers` (module paths in vLLM's model, which must hold every weight sent); then drop
    what was derived from the old weights, as ``GPUModelRunner.reload_weights`` does.

    Falls back to vLLM's full reload when a name is not a module of the model (an MoE
    checkpoint names experts one by one, vLLM fuses them) or the engine serves LoRA adapters
    (their wrappers hold tensors no checkpoint weight fills)."""
    runner = worker.model_runner
    model = runner.model
    try:
        modules = [model.get_submodule(name) for name in layers]
    except AttributeError:
        modules = None
    if modules is None or worker.vllm_config.lora_config is not None:
        runner.reload_weights(weights_iterator=weights)
        return
    load_layerwise(worker, weights, modules)
    runner.reset_lora_state()
    runner.reset_encoder_cache()
    runner.reset_mm_cache()
