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
    torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]  # "cpu", no index
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
    _patch_checkpoint_rng()
    patch_moe_dispatcher_cpu()
    if hasattr(optimizer_mod, "clip_grad_by_total_norm_fp32"):
        optimizer_mod.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_cpu
    _APPLIED = True


_NO_STREAM = object()  # stands in for the class-level side stream on CPU


def _host(value: Any, as_numpy: bool = False) -> Any:
    import torch

    if torch.is_tensor(value) and as_numpy:
        return value.cpu().numpy()
    return value


def _dtoh_cpu(self: Any, point: str, tokens_per_expert: Any = None) -> Any:
    """`_maybe_dtoh_and_synchronize` without streams: same values, same point."""
    if not self.drop_and_pad and point == self.cuda_dtoh_point:
        self.input_splits = _host(self.input_splits, as_numpy=True)
        self.output_splits = _host(self.output_splits, as_numpy=True)
        self.output_splits_tp = _host(self.output_splits_tp, as_numpy=True)
    return tokens_per_expert


def patch_moe_dispatcher_cpu() -> None:
    """Make megatron-core's MoE layer build and run without CUDA (idempotent).

    `MoEAlltoAllTokenDispatcher` creates a `torch.cuda.Stream()` in its constructor and copies
    the token counts of each expert / EP rank to the host on that side stream
    (`_maybe_dtoh_and_synchronize`). On CPU the counts are host tensors already: the stream is
    never created, and the split sizes become the numpy arrays the CUDA path makes (the
    all-to-all and the permutation read them as host sizes). Without transformer_engine,
    megatron-core 0.16's `moe_utils` leaves `te_general_gemm` undefined (its import fallback
    sets no name), so the router's gating linear raises NameError: it is set to None, the
    value the router checks for."""
    try:
        from megatron.core.transformer.moe import moe_utils
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    except ImportError:  # megatron-core without MoE: nothing to patch
        return
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:
        MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _NO_STREAM
    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = _dtoh_cpu


def _cpu_rng_state(*_args: Any, **_kwargs: Any) -> Any:
    import torch

    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: Any, *_args: Any, **_kwargs: Any) -> None:
    import torch

    torch.set_rng_state(new_state)


def _patch_checkpoint_rng() -> None:
    """Activation recompute (`tensor_parallel.random.CheckpointFunction`, megatron's
    `checkpoint`) saves and restores the device RNG through `_get_cuda_rng_state` /
    `_set_cuda_rng_state` so a recomputed forward draws the same dropout masks; on CPU the
    device generator is the CPU one."""
    import megatron.core.tensor_parallel.random as mp_random

    mp_random._get_cuda_rng_state = _cpu_rng_state
    mp_random._set_cuda_rng_state = _set_cpu_rng_state


@contextlib.contextmanager
def tensor_cuda_is_identity(active: bool) -> Iterator[None]:
    """`tensor.cuda()` keeps a CPU tensor where it is, for the two megatron calls that move
    tensors to the device unconditionally: `LanguageModule.setup_embeddings_and_output_layer`
    (the tied output-layer copy, before all-reducing it over the embedding group when PP > 1,
    while a model is built) and `DistributedOptimizer.get_parameter_state_dp_zero` (the
    optimizer shards, before gathering them for a checkpoint)."""
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

    torch.Tensor.type = cuda_named  # type: ignore[method-assign, assignment]
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


class SequenceParallelTorchNorm:
    """The local layer spec's norm under sequence parallelism.

    Covers `megatron.core.transformer.torch_norm.WrappedTorchNorm.__new__`, which asserts
    `not config.sequence_parallel` (megatron expects TE's or apex's norm there; neither exists
    on CPU). A norm over the hidden dimension is per token, so it is exact on a sequence
    shard; its weight then gets a different gradient on each TP rank, which megatron's
    `finalize_model_grads` all-reduces over TP for parameters marked `sequence_parallel`,
    as TE's and apex's norms mark theirs.
    """

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **_unused: Any) -> Any:
        import torch

        norms = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}
        if config.normalization not in norms:
            raise ValueError(f"no sequence-parallel torch norm for {config.normalization}")
        norm = norms[config.normalization](hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm


def gloo_pipeline_overrides() -> dict[str, Any]:
    """TransformerConfig fields for pipelines over gloo.

    megatron's batched point-to-point (`batch_p2p_comm`, `_batched_p2p_ops`) posts sends to
    the previous and the next stage in one batch; at PP 2 both are the same peer, and gloo
    matches messages between a pair of ranks by posting order, so under the interleaved
    (virtual pipeline) schedule an activation can land in a gradient's buffer (same shape,
    silently wrong). The unbatched `_p2p_ops` orders even / odd ranks and, at PP 2, puts the
    two directions on different groups, which gloo matches correctly.
    """
    return {"batch_p2p_comm": False}


def patch_distributed_optimizer_step_state() -> None:
    """Loading the distributed optimizer's state with torch's Adam (no apex / TE).

    Covers `DistributedOptimizer._set_main_param_and_optimizer_states`: it copies every key of
    the optimizer's per-parameter state from the loaded tensors, but torch's Adam keeps a
    `step` there that the loaders (`load_parameter_state_from_fully_reshardable`,
    `..._fs_model_space`) leave out on purpose (`load_state_dict` restores the step from the
    param groups), so every load fails with `KeyError: 'step'`. The step is set aside while
    the other tensors are copied. Idempotent; needed on any device without apex / TE.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer._set_main_param_and_optimizer_states
    if getattr(original, "_mindrl_keeps_step", False):
        return

    def set_states(self: Any, model_param: Any, tensors: dict[str, Any]) -> None:
        if "step" in tensors or self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            original(self, model_param, tensors)
            return
        group, order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group]["params"][order]]
        step = state.pop("step", None)
        try:
            original(self, model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step

    set_states._mindrl_keeps_step = True  # type: ignore[attr-defined]
    DistributedOptimizer._set_main_param_and_optimizer_states = set_states


def mla_without_transformer_engine() -> None:
    """megatron-core's MLA module decides it has Transformer Engine when its extension module
    imports, which it does without TE (its classes are then stand-ins, not classes) and
    `isinstance(x, stand_in)` raises; without TE the answer is no."""
    from megatron.core.transformer import multi_latent_attention as mla

    if not isinstance(getattr(mla, "TELinear", None), type):
        mla.HAVE_TE = False
