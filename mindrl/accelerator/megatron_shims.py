"""CPU shims for the places where megatron-core hard-codes CUDA.

Applied only on CPU (`Accelerator.apply_megatron_shims`), idempotent. Each shim names the
megatron-core call it covers. On NPU, MindSpeed's adaptor plays this role; on CUDA none is
needed.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

_APPLIED = False


def _cpu_current_device() -> str:
    return "cpu"


def _noop_synchronize(device: Any = None) -> None:
    return None


def _clip_grad_by_total_norm_cpu(
    parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
) -> None:
    """Scale grads by max_norm / total_norm, as megatron does, without its CUDA type assert."""
    import torch

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr) for p in parameters if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        for g in grads:
            g.mul_(clip_coeff)


class _CpuTorchView:
    """`torch` as megatron's optimizer modules see it, with device='cuda' meaning CPU.

    `FP32Optimizer.__init__`, `MixedPrecisionOptimizer.__init__`, `clip_grads.get_grad_norm_fp32`,
    `utils.local_multi_tensor_l2_norm` and the `pipeline_parallel.schedules` build scalars with `torch.tensor(..., device='cuda')` / `torch.zeros(..., device='cuda')`.
    Only those modules get this view; the rest of the process keeps the real torch.
    """

    _FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "zeros_like", "ones_like")

    def __init__(self, torch_module: Any):
        self._torch = torch_module

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._torch, name)
        if name not in self._FACTORIES:
            return attr

        def factory(*args: Any, **kwargs: Any) -> Any:
            device = kwargs.get("device")
            if device is not None and str(device).startswith("cuda"):
                kwargs["device"] = "cpu"
            return attr(*args, **kwargs)

        return factory


def apply_cpu_shims() -> None:
    """Patch the CUDA-only calls megatron-core makes so TP/PP training runs on CPU over gloo."""
    global _APPLIED
    if _APPLIED:
        return
    import torch

    # rotary embedding (`RotaryEmbedding.forward`), TP mappings and layer init build tensors
    # on `torch.cuda.current_device()`.
    torch.cuda.current_device = _cpu_current_device
    # dist_checkpointing's preload / async save and timers call `torch.cuda.synchronize()`.
    torch.cuda.synchronize = _noop_synchronize

    # `MegatronOptimizer.clip_grad_norm` -> `clip_grad_by_total_norm_fp32` asserts every grad
    # is a `torch.cuda.FloatTensor`.
    try:
        import megatron.core.optimizer.clip_grads as clip_grads
        import megatron.core.optimizer.optimizer as optimizer_mod
        import megatron.core.pipeline_parallel.schedules as schedules
        import megatron.core.utils as core_utils
    except ImportError:  # megatron-core not installed: nothing to patch
        _APPLIED = True
        return
    # `megatron.core.utils.local_multi_tensor_l2_norm` (the no-apex grad-norm path) too, and
    # every pipeline schedule's `torch.zeros([], dtype=torch.int, device="cuda")` token count.
    for module in (clip_grads, optimizer_mod, core_utils, schedules):
        if not isinstance(module.torch, _CpuTorchView):
            module.torch = _CpuTorchView(module.torch)
    clip_grads.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_cpu
    if hasattr(optimizer_mod, "clip_grad_by_total_norm_fp32"):
        optimizer_mod.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_cpu
    _APPLIED = True


@contextlib.contextmanager
def tensor_cuda_is_identity(active: bool) -> Iterator[None]:
    """While building a model on CPU: `LanguageModule.setup_embeddings_and_output_layer`
    calls `weight.data.cuda()` on the tied output-layer copy before all-reducing it over the
    embedding group when PP > 1; keep the tensor where it is."""
    if not active:
        yield
        return
    import torch

    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = original  # type: ignore[method-assign]


@contextlib.contextmanager
def cuda_tensor_type_names(active: bool) -> Iterator[None]:
    """While building megatron's optimizer on CPU: `Float16OptimizerWithFloat16Params.__init__`
    accepts only parameters whose `param.type()` is `torch.cuda.{Half,BFloat16,Float}Tensor`;
    report CPU tensors under those names for the duration (bf16 training on CPU)."""
    if not active:
        yield
        return
    import torch

    original = torch.Tensor.type

    def cuda_named(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name = original(self, *args, **kwargs)
        if not args and not kwargs and isinstance(name, str) and not self.is_cuda:
            return name.replace("torch.", "torch.cuda.", 1)
        return name

    torch.Tensor.type = cuda_named  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.type = original  # type: ignore[method-assign]


def seed_megatron_if_initialized(seed: int) -> None:
    """Seed megatron's tensor-parallel RNG tracker once parallel state exists.

    `model_parallel_cuda_manual_seed` calls `torch.cuda.get_rng_state` for its default tracker;
    with `inference_rng_tracker=True` (megatron-core >= 0.12) it uses a CPU-safe tracker, and
    `force_reset_rng=True` lets a second call re-seed instead of raising.
    """
    try:
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    except ImportError:
        return
    if not parallel_state.model_parallel_is_initialized():
        return
    params = inspect.signature(model_parallel_cuda_manual_seed).parameters
    kwargs: dict[str, Any] = {}
    if "inference_rng_tracker" in params:
        kwargs["inference_rng_tracker"] = True
    if "force_reset_rng" in params:
        kwargs["force_reset_rng"] = True
    model_parallel_cuda_manual_seed(seed, **kwargs)
