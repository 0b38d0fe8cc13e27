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


def wrap_for_training(model: Any) -> Any:
    """megatron's DDP around `model`, with grads reduced in fp32; the schedule's
    `finalize_model_grads` all-reduces grads over DP (and ties embeddings across PP)."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    model.train()
    ddp = DistributedDataParallel(
        model.config,
        DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=False),
        model,
    )
    model.config.finalize_model_grads_func = finalize_model_grads
    return ddp


def build_optimizer(
    cfg: RoleConfig, model_chunks: list[Any], total_steps: int, *, on_cpu: bool
) -> TrainingOptimizer:
    """Adam over `model_chunks` (mixed precision when the role trains in bf16 / fp16) and a
    warm-up + decay schedule over `total_steps` optimizer steps."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from mindrl.accelerator.megatron_shims import cuda_tensor_type_names

    o, p = cfg.optim, cfg.precision
    if cfg.parallel.use_distributed_optimizer:
        logger.warning(
            "use_distributed_optimizer is not used: mindrl builds megatron's DDP with a "
            "replicated optimizer (the distributed optimizer does not run on CPU)"
        )
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
        use_distributed_optimizer=False,
    )
    with cuda_tensor_type_names(on_cpu):
        optimizer = get_megatron_optimizer(opt_cfg, model_chunks)
    for chunk in model_chunks:
        chunk.config.grad_scale_func = optimizer.scale_loss
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
