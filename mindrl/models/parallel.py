"""torch.distributed + megatron parallel_state set-up and tear-down for a TP x PP (x DP, x EP)
layout.

One function brings a process into the layout the trainer, the tests and the offline converter
need, on any accelerator: the accelerator picks the backend (gloo on CPU) and the device,
megatron's CUDA shims are applied on CPU, and megatron's RNG trackers are seeded. A world of one
process needs no port (an in-memory HashStore rendezvous), which is how the offline converter
runs dist_checkpointing without a launcher.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from mindrl.accelerator import get_accelerator

_OWNS_PROCESS_GROUP = False


@dataclass(frozen=True)
class ParallelInfo:
    """Where this process sits in the TP x PP x DP layout."""

    rank: int
    world_size: int
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    accelerator: str

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1


_LISTEN_SOCKETS: list[Any] = []


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def rendezvous_store(
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout: timedelta,
    *,
    wait_for_workers: bool = True,
) -> Any:
    """torch's TCPStore for the rendezvous, listening on `master_addr` only (port 0: a free
    one, `store.port`). Without `wait_for_workers` rank 0 returns before the others join.

    `init_method="tcp://..."` makes rank 0's store listen on every interface; here rank 0
    binds the socket itself (the master address: loopback on one machine, the node's
    address on a cluster) and hands it to the store.
    """
    import socket

    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=timeout)
    family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((master_addr, master_port))
    master_port = sock.getsockname()[1]  # port 0 asked for a free one: the store reports it
    sock.listen(max(world_size, 16))
    store = dist.TCPStore(
        master_addr,
        master_port,
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=wait_for_workers,
        master_listen_fd=sock.fileno(),
    )
    _LISTEN_SOCKETS.append(sock)  # the store serves from this socket: keep it open
    return store


def init_parallel(
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    *,
    expert_parallel_size: int = 1,
    context_parallel_size: int = 1,
    accelerator: str = "auto",
    virtual_pipeline_size: int | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    seed: int | None = 1234,
    timeout_s: float = 600.0,
) -> ParallelInfo:
    """Initialise torch.distributed (if not yet) and megatron's parallel_state for TP x PP.

    rank / world_size / local_rank / master address and port default to the usual launcher
    environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). An existing default
    process group (Ray worker, vLLM colocation) is reused and left alone by `destroy_parallel`.
    If parallel_state is already initialised with the same TP/PP it is reused as is.
    `virtual_pipeline_size`: model chunks per pipeline rank (the interleaved schedule).
    `expert_parallel_size`: MoE experts split over this many ranks of each pipeline stage
    (megatron's expert group; experts keep TP inside it); it must divide the world / PP.
    `context_parallel_size`: each sequence split over this many ranks (megatron's CP group,
    inside each TP x CP block of a stage; `mindrl.models.context_parallel`).
    """
    import torch.distributed as dist
    from megatron.core import parallel_state

    global _OWNS_PROCESS_GROUP
    acc = get_accelerator(accelerator)
    acc.apply_megatron_shims()
    if not dist.is_initialized():
        rank = _env_int("RANK", 0) if rank is None else rank
        world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        local_rank = _env_int("LOCAL_RANK", rank) if local_rank is None else local_rank
        acc.set_device(local_rank)
        timeout = timedelta(seconds=timeout_s)
        master_addr = master_addr or os.environ.get("MASTER_ADDR")
        master_port = master_port or _env_int("MASTER_PORT", 0) or None
        if world_size == 1 and (master_addr is None or master_port is None):
            store = dist.HashStore()
            dist.init_process_group(acc.dist_backend, store=store, rank=0, world_size=1)
        else:
            if master_addr is None or master_port is None:
                raise ValueError("init_parallel: world_size > 1 needs master_addr and master_port")
            store = rendezvous_store(master_addr, master_port, rank, world_size, timeout)
            dist.init_process_group(
                acc.dist_backend, store=store, rank=rank, world_size=world_size, timeout=timeout
            )
        _OWNS_PROCESS_GROUP = True
    world = dist.get_world_size()
    model_parallel = tensor_parallel_size * pipeline_parallel_size * context_parallel_size
    if world % model_parallel:
        raise ValueError(
            f"world size {world} is not divisible by TP x PP x CP = "
            f"{tensor_parallel_size} x {pipeline_parallel_size} x {context_parallel_size}"
        )
    if (world // pipeline_parallel_size) % (expert_parallel_size * tensor_parallel_size):
        raise ValueError(
            f"world size {world} / PP {pipeline_parallel_size} is not divisible by "
            f"EP x TP = {expert_parallel_size} x {tensor_parallel_size}"
        )
    if parallel_state.model_parallel_is_initialized():
        same = (
            parallel_state.get_tensor_model_parallel_world_size() == tensor_parallel_size
            and parallel_state.get_pipeline_model_parallel_world_size() == pipeline_parallel_size
            and parallel_state.get_expert_model_parallel_world_size() == expert_parallel_size
            and parallel_state.get_context_parallel_world_size() == context_parallel_size
        )
        if not same:
            raise RuntimeError(
                "megatron parallel_state is already initialised with another TP/PP/EP; "
                "call destroy_parallel() first"
            )
    else:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel_size,
            pipeline_model_parallel_size=pipeline_parallel_size,
            virtual_pipeline_model_parallel_size=virtual_pipeline_size,
            expert_model_parallel_size=expert_parallel_size,
            context_parallel_size=context_parallel_size,
        )
    if seed is not None:
        acc.seed(seed)
    return parallel_info(accelerator)


def parallel_info(accelerator: str = "auto") -> ParallelInfo:
    """The current layout (parallel_state must be initialised)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    return ParallelInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=ps.get_tensor_model_parallel_world_size(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        pp_size=ps.get_pipeline_model_parallel_world_size(),
        dp_rank=ps.get_data_parallel_rank(),
        dp_size=ps.get_data_parallel_world_size(),
        accelerator=get_accelerator(accelerator).name,
    )


def tp_rank_size() -> tuple[int, int]:
    """(TP rank, TP size); (0, 1) when megatron's parallel state is not set up (plain tests)."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()


def destroy_parallel() -> None:
    """Undo `init_parallel`: megatron's groups, and the process group if we created it."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from mindrl.models.cp_layout import forget_cp_subgroups

    global _OWNS_PROCESS_GROUP
    forget_cp_subgroups()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if _OWNS_PROCESS_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    _OWNS_PROCESS_GROUP = False
