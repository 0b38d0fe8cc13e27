"""Base class for the Ray actors of a worker group: who am I, where is my master.

A `WorkerGroup` sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
MINDRL_ROLE in each actor's environment before its constructor runs, so a subclass can call
`torch.distributed.init_process_group(backend)` with the default env:// rendezvous.

Ray narrows the accelerator's visible-devices variable (CUDA_VISIBLE_DEVICES /
ASCEND_RT_VISIBLE_DEVICES) to the devices it gave the actor, so inside an actor its device is
index 0, while LOCAL_RANK keeps torchrun's meaning (position among this group's ranks on the
node).
"""

from __future__ import annotations

import os
import sys
from typing import Any


def apply_thread_budget() -> None:
    """torch's intra-op threads from `MINDRL_NUM_THREADS` (the driver sets it per worker from
    its bundle's CPUs), before any engine or model starts (vLLM later makes
    `torch.set_num_threads` a no-op)."""
    threads = int(os.environ.get("MINDRL_NUM_THREADS", "0"))
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


def enter_driver_directory() -> None:
    """Work in the driver's directory (`MINDRL_DRIVER_CWD`) when it exists here, so relative
    config paths resolve as they do for the driver (a `ray start` cluster starts its workers
    in the directory `ray start` ran in)."""
    cwd = os.environ.get("MINDRL_DRIVER_CWD")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)


class Worker:
    """Reads its place in the group from the environment; subclasses add the real work."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from mindrl.logs import setup_worker_logging  # OUTPUT_DIR/logs; before vLLM loads

        setup_worker_logging()
        enter_driver_directory()
        env = os.environ
        self.role = env.get("MINDRL_ROLE", "worker")
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.local_world_size = int(env.get("LOCAL_WORLD_SIZE", "1"))
        self.master_addr = env.get("MASTER_ADDR", "127.0.0.1")
        self.master_port = int(env.get("MASTER_PORT", "0"))
        self._dp_rank: int | None = None
        apply_thread_budget()

    # -- identity / liveness ------------------------------------------------------------------
    def ping(self) -> int:
        """Cheap round trip; returns the rank."""
        return self.rank

    def pid(self) -> int:
        return os.getpid()

    def node_ip(self) -> str:
        """The IP Ray knows this node by (eth0's on a single box, not 127.0.0.1)."""
        import ray

        return ray.util.get_node_ip_address()

    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    # -- rendezvous ---------------------------------------------------------------------------
    def set_master(self, addr: str, port: int) -> None:
        """Point the env:// rendezvous elsewhere (before init_process_group)."""
        self.master_addr, self.master_port = addr, int(port)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)

    # -- data-parallel position ---------------------------------------------------------------
    def set_dp_rank(self, dp_rank: int) -> None:
        """Record this rank's data-parallel index after the parallel layout is initialised."""
        self._dp_rank = int(dp_rank)

    def dp_rank(self) -> int:
        """Data-parallel index: what `set_dp_rank` recorded, else megatron's when initialised,
        else the rank itself (pure data parallel)."""
        if self._dp_rank is not None:
            return self._dp_rank
        mpu = sys.modules.get("megatron.core.parallel_state")
        if mpu is not None and mpu.model_parallel_is_initialized():
            return int(mpu.get_data_parallel_rank())
        return self.rank
