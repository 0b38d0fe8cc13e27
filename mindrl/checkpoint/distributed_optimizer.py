"""The distributed (ZeRO-1) optimizer's state in a trainer checkpoint, reshardable over DP.

Each DP rank holds a shard of the fp32 master weights and Adam moments, laid out by
megatron's gradient buckets, which depend on the DP size. megatron's `fully_reshardable`
format gathers the shards into one tensor per model parameter (its canonical form) and
writes them with dist_checkpointing, so a checkpoint saved at DP 2 resumes at DP 1 or 4
(and at another TP / PP). Written beside the model shards as ITER/dist_optimizer/; the
rank file records only that the optimizer state lives there. Loading checks the folder's
pickled parts hold plain data before dist_checkpointing reads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mindrl.checkpoint.errors import CheckpointReadError

DIST_OPTIM_DIR = "dist_optimizer"
SHARDING = {"distrib_optim_sharding_type": "fully_reshardable"}
# what the rank file holds in place of the optimizer state (plain data)
RANK_FILE_MARKER = {"distributed_optimizer": DIST_OPTIM_DIR}


def is_distributed(optimizer: Any) -> bool:
    """Whether megatron built the distributed optimizer (possibly inside a chain)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    return any(isinstance(p, DistributedOptimizer) for p in parts)


def save_distributed_optimizer(
    optimizer: Any, model_chunks: list[Any], iter_dir: str | Path
) -> None:
    """Collective over the role's ranks: the optimizer state in parameter space."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from mindrl.checkpoint.mcore_io import model_sharded_state_dict

    folder = Path(iter_dir) / DIST_OPTIM_DIR
    if dist.get_rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    with _host_tensors_stay():
        state = optimizer.sharded_state_dict(
            model_sharded_state_dict(model_chunks), is_loading=False, metadata=SHARDING
        )
    dist_checkpointing.save(state, str(folder))


def load_distributed_optimizer(
    optimizer: Any, model_chunks: list[Any], iter_dir: str | Path
) -> None:
    """Collective: each rank takes its shard of the saved state, at the current DP size."""
    from megatron.core import dist_checkpointing

    from mindrl.checkpoint.mcore_io import model_sharded_state_dict
    from mindrl.checkpoint.safe_load import check_dcp_folder

    folder = Path(iter_dir) / DIST_OPTIM_DIR
    if not folder.is_dir():
        raise CheckpointReadError(
            folder,
            "missing: this checkpoint was saved without the distributed optimizer "
            "(use_distributed_optimizer), so its optimizer state cannot be sharded here; set "
            "no_load_optim to load the weights only",
        )
    from mindrl.accelerator.megatron_shims import patch_distributed_optimizer_step_state

    check_dcp_folder(folder)
    patch_distributed_optimizer_step_state()
    _create_adam_state(optimizer)
    with _host_tensors_stay():
        request = optimizer.sharded_state_dict(
            model_sharded_state_dict(model_chunks), is_loading=True, metadata=SHARDING
        )
        optimizer.load_state_dict(dist_checkpointing.load(request, str(folder)))
    _unshare_adam_steps(optimizer)


def _create_adam_state(optimizer: Any) -> None:
    """Give a fresh optimizer its Adam state (step, moments) so it has tensors to load into:
    without apex / TE, megatron's `DistributedOptimizer.state_dict()` needs a step count. One
    step at learning rate 0 on zero gradients changes no parameter; the load overwrites the
    state."""
    import torch

    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = part.optimizer
        if inner.state:
            continue
        saved_lr = [group["lr"] for group in inner.param_groups]
        for group in inner.param_groups:
            group["lr"] = 0.0
            for param in group["params"]:
                param.grad = torch.zeros_like(param)
        inner.step()
        inner.zero_grad(set_to_none=True)
        for group, lr in zip(inner.param_groups, saved_lr):
            group["lr"] = lr


def _unshare_adam_steps(optimizer: Any) -> None:
    """megatron's `DistributedOptimizer.load_state_dict` (torch-Adam path) gives every
    parameter the same `step` tensor; torch's Adam increments each parameter's step in place,
    so a shared one would advance once per parameter per step and skew the bias correction.
    Each parameter gets its own copy."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in part.optimizer.state.values():
            if "step" in state:
                state["step"] = state["step"].clone()


def _host_tensors_stay() -> Any:
    """On CPU, megatron's gather of the shards (`get_parameter_state_dp_zero`) moves them
    with `.cuda()`; keep them where they are."""
    from mindrl.accelerator import get_accelerator
    from mindrl.accelerator.megatron_shims import tensor_cuda_is_identity

    return tensor_cuda_is_identity(get_accelerator().is_cpu)
