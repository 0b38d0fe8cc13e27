"""megatron-core's DDP wrapper, optimizer and LR schedule for a trained role.

Lives beside the model builder because it is model code: which parameters are trained, in
which precision, with which schedule. The Ray shells only call `wrap_for_training` and
`build_optimizer`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mindrl.config.role import OptimizerConfig, RoleConfig
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


def _precision_aware(o: OptimizerConfig) -> dict[str, Any]:
    """Off CPU megatron's precision-aware optimizer does it (transformer-engine's FusedAdam;
    megatron refuses it without TE); on CPU mindrl's host Adam (`models/host_adam.py`)."""
    if not o.use_precision_aware_optimizer:
        return {}
    return {
        "use_precision_aware_optimizer": True,
        "exp_avg_dtype": torch_dtype(o.exp_avg_dtype),
        "exp_avg_sq_dtype": torch_dtype(o.exp_avg_sq_dtype),
    }


def warn_if_second_moment_stalls(o: OptimizerConfig) -> bool:
    """bf16 resolves 2^-8 of a value: a bf16 exp_avg_sq whose decay per step, 1 - beta2, is
    under half of that (0.2-0.4%) is rounded back to where it was; megatron does not warn."""
    if o.use_precision_aware_optimizer and o.exp_avg_sq_dtype == "bf16" and o.adam_beta2 > 0.996:
        logger.warning(
            "exp_avg_sq_dtype: bf16 with adam_beta2 %s: where a decay by (1 - beta2) is under "
            "half a bf16 step the second moment stops decaying (some values above 0.996, every "
            "value from ~0.998); fp32, or adam_beta2 <= 0.996, keeps it decaying",
            o.adam_beta2,
        )
        return True
    return False


def _per_chunk(funcs: list[Any]) -> Any:
    return funcs[0] if len(funcs) == 1 else funcs


def build_optimizer(
    cfg: RoleConfig, model_chunks: list[Any], total_steps: int, *, on_cpu: bool
) -> TrainingOptimizer:
    """Adam over `model_chunks` (mixed precision when the role trains in bf16 / fp16) and a
    warm-up + decay schedule over `total_steps` optimizer steps."""
    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from mindrl.accelerator.megatron_shims import cuda_tensor_type_names
    from mindrl.models.host_adam import fuse_host_adam, use_low_precision_moments

    o, p = cfg.optim, cfg.precision
    warn_if_second_moment_stalls(o)
    opt_cfg = MegatronOptimizerConfig(
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
        **({} if on_cpu else _precision_aware(o)),
    )
    with cuda_tensor_type_names(on_cpu):
        optimizer = get_megatron_optimizer(opt_cfg, model_chunks)
    if on_cpu:
        use_low_precision_moments(optimizer, o.exp_avg_dtype, o.exp_avg_sq_dtype)
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
