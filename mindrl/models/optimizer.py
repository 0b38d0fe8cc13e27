"""megatron-core's DDP wrapper, optimizer and LR schedule for a trained role.

Lives beside the model builder because it is model code: which parameters are trained, in
which precision, with which schedule. The Ray shells only call `wrap_for_training` and
`build_optimizer`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mindrl.config.role import RoleConfig
from mindrl.models.dtypes import torch_dtype

logger = logging.getLogger(__name__)


@dataclass
class TrainingOptimizer:
    """megatron's optimizer and its parameter scheduler, stepped together."""

    optimizer: Any  # megatron.core.optimizer.MegatronOptimizer
    scheduler: Any  # megatron.core.optimizer_param_scheduler.OptimizerParamScheduler


def wrap_for_training(model: Any, cfg: RoleConfig, chunk_index: int = 0) -> Any:
    """megatron's DDP around one model chunk (`models/scale.py` says how: fp32 grad reduction,
    distributed-optimizer buffers, overlap); the schedule's `finalize_model_grads` reduces
    grads over DP (and ties embeddings across PP). As megatron's `get_model` does, only the
    first chunk of a virtual pipeline buckets its gradients."""
    from megatron.core.distributed import DistributedDataParallel, finalize_model_grads

    from mindrl.models.scale import ddp_config

    model.train()
    ddp = DistributedDataParallel(
        model.config, ddp_config(cfg), model, disable_bucketing=chunk_index > 0
    )
    model.config.finalize_model_grads_func = finalize_model_grads
    return ddp


def _per_chunk(funcs: list[Any]) -> Any:
    return funcs[0] if len(funcs) == 1 else funcs


def build_optimizer(
    cfg: RoleConfig, model_chunks: list[Any], total_steps: int, *, on_cpu: bool
) -> TrainingOptimizer:
    """Adam over `model_chunks` (mixed precision when the role trains in bf16 / fp16) and a
    warm-up + decay schedule over `total_steps` optimizer steps."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from mindrl.accelerator.megatron_shims import cuda_tensor_type_names

    o, p = cfg.optim, cfg.precision
    opt_cfg = OptimizerConfig(
        optimizer="adam",
        lr=o.lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        clip_grad=o.clip_grad,
        bf16=p.bf16,
        fp16=p.fp16,
        params_dtype=torch_dtype(p.params_dtype),
        initial_loss_scale=o.initial_loss_scale,
        use_distributed_optimizer=cfg.parallel.use_distributed_optimizer,
    )
    with cuda_tensor_type_names(on_cpu):
        optimizer = get_megatron_optimizer(opt_cfg, model_chunks)
    fuse_host_adam(optimizer)
    for chunk in model_chunks:
        chunk.config.grad_scale_func = optimizer.scale_loss
        if cfg.memory.overlap_grad_reduce:
            # the schedule starts / finishes the overlapped bucket reductions (as megatron's
            # training loop sets them: one callable per chunk, a bare one for one chunk)
            chunk.config.no_sync_func = _per_chunk([c.no_sync for c in model_chunks])
            chunk.config.grad_sync_func = _per_chunk([c.start_grad_sync for c in model_chunks])
        if cfg.memory.overlap_param_gather:
            chunk.config.param_sync_func = _per_chunk([c.start_param_sync for c in model_chunks])
    total = max(total_steps, 1)
    warmup = o.lr_warmup_iters or int(o.lr_warmup_fraction * total)
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if warmup else o.lr,
        max_lr=o.lr,
        min_lr=min(o.min_lr, o.lr),
        lr_warmup_steps=warmup,
        lr_decay_steps=total,
        lr_decay_style=o.lr_decay_style,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=total,
        wd_incr_style="constant",
    )
    return TrainingOptimizer(optimizer, scheduler)


def clip_grads_to_norm(optimizer: Any, max_norm: float, total_norm: float) -> None:
    """Scale the gradients so that their global norm `total_norm` (already computed over all
    of the optimizer's parameters) is at most `max_norm`.

    With MoE, megatron builds a ChainedOptimizer (dense and expert parameters apart), whose
    `clip_grad_norm` refuses to run; each part is clipped with the one global norm, as
    megatron's own chained `step` does. The clip function is looked up at call time, so the
    CPU shim that replaces it applies.
    """
    import megatron.core.optimizer.optimizer as optimizer_mod

    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        params = part.get_parameters()
        if params:
            optimizer_mod.clip_grad_by_total_norm_fp32(
                params,
                max_norm,
                total_norm,
                part.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8,
            )


def fuse_host_adam(optimizer: Any) -> int:
    """Switch torch's Adam / AdamW over host parameters to its fused CPU kernel; returns how
    many parameter groups were switched.

    Without apex / TE (every CPU run) megatron steps with `torch.optim.AdamW` at its defaults,
    which on CPU is the per-tensor loop: ~10 passes over every parameter-sized tensor. The fused
    kernel makes one (SmolLM2-135M fp32 on 2 cores: 460 ms -> 49 ms a step; the two differ
    by rounding only, ~1 ulp). A group on another device keeps what megatron chose. Called after
    a checkpoint's optimizer state is loaded too: torch restores the saved group options."""
    import torch

    switched = 0
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", None)
        if not isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            continue
        for group in inner.param_groups:
            params = group["params"]
            on_host = all(p.device.type == "cpu" and p.is_floating_point() for p in params)
            if not params or not on_host or group.get("differentiable") or group.get("fused"):
                continue
            group["fused"], group["foreach"] = True, False
            switched += 1
    return switched
