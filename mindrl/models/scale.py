"""megatron-core's scale features as a role's config asks for them: sequence parallel,
activation recompute, the virtual pipeline, the fused SwiGLU, and the DDP /
distributed-optimizer settings.

One place turns the YAML keys into megatron's TransformerConfig fields and
DistributedDataParallelConfig, so the actor, the reference and the tests build the same
model for the same keys. None of these changes what is computed, only where activations,
optimizer state and communication live.
"""

from __future__ import annotations

import logging
from typing import Any

from mindrl.config.role import RoleConfig
from mindrl.models.host_fusions import mindrl_fuses_here

logger = logging.getLogger(__name__)


def sequence_parallel(cfg: RoleConfig) -> bool:
    """SP splits activations over the TP group, so it only exists at TP > 1 (megatron turns
    it off at TP 1 the same way)."""
    if cfg.parallel.sequence_parallel and cfg.tp == 1:
        logger.warning(
            "%s: sequence_parallel has no effect at tensor_model_parallel_size 1", cfg.role
        )
        return False
    return cfg.parallel.sequence_parallel


def virtual_pipeline_size(cfg: RoleConfig) -> int | None:
    """Model chunks per pipeline rank (None: the plain 1F1B pipeline)."""
    per_chunk = cfg.parallel.num_layers_per_virtual_pipeline_stage
    if per_chunk is None:
        return None
    return cfg.model.num_layers // (cfg.pp * per_chunk)


def transformer_overrides(cfg: RoleConfig) -> dict[str, Any]:
    """TransformerConfig fields for this role's scale keys (validated at config time by
    `config/scale_rules.py`)."""
    mem = cfg.memory
    out: dict[str, Any] = {"sequence_parallel": sequence_parallel(cfg)}
    if mem.recompute_granularity is not None:
        out["recompute_granularity"] = mem.recompute_granularity
        out["recompute_method"] = mem.recompute_method
        out["recompute_num_layers"] = mem.recompute_num_layers
    stages = cfg.layer_layout.megatron_layout()
    if stages is not None:  # MindSpeed's uneven num_layer_list
        out["pipeline_model_parallel_layout"] = stages
    vpp = virtual_pipeline_size(cfg)
    if vpp is not None:
        out["virtual_pipeline_model_parallel_size"] = vpp
    if cfg.kernels.use_fused_swiglu and cfg.model.swiglu and mindrl_fuses_here():
        # megatron's own fused SwiGLU (compiled by its jit_fuser): one pass each way, keeps
        # only its input (`models/host_fusions.py`); NPU hands the key to MindSpeed as well
        out["bias_activation_fusion"] = True
    if cfg.kernels.use_fused_rotary_pos_emb and mindrl_fuses_here():
        # megatron's fused-rope path: transformer engine's kernel where it is installed, else
        # mindrl's (one autograd node per rotation, `models/fused_rope.py`)
        out["apply_rope_fusion"] = True
    return out


def ddp_config(cfg: RoleConfig) -> Any:
    """megatron's DistributedDataParallelConfig: grads reduced in fp32, the distributed
    optimizer's sharded buffers, and bucket overlap as configured."""
    from megatron.core.distributed import DistributedDataParallelConfig

    mem = cfg.memory
    kwargs: dict[str, Any] = dict(
        grad_reduce_in_fp32=True,
        use_distributed_optimizer=cfg.parallel.use_distributed_optimizer,
        overlap_grad_reduce=mem.overlap_grad_reduce,
        overlap_param_gather=mem.overlap_param_gather,
    )
    if mem.ddp_bucket_size is not None:
        kwargs["bucket_size"] = mem.ddp_bucket_size
    return DistributedDataParallelConfig(**kwargs)
