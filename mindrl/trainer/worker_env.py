"""The environment a run's role workers start with, and the part the driver takes too.

Kept apart from `roles.py` so the entry point can read it before anything imports megatron:
MindSpeed's switches must be in the driver's environment before its first megatron import
(`mindspeed_args.prepare_megatron`), and the same switches reach every worker.
"""

from __future__ import annotations

import os

from mindrl.accelerator import get_accelerator, mindspeed_args
from mindrl.config.fates import MINDSPEED, Handoffs, handoffs
from mindrl.config.run import RunConfig

# Set by the user for the driver and meant for every worker too.
_FORWARDED = ("MINDRL_ASSETS_DIR", "MINDRL_ACCELERATOR")


def handed_env(handed: Handoffs) -> dict[str, str]:
    """The run's handed keys as the environment variables their readers take them from: the
    backend's own (hccl_buffersize -> HCCL_BUFFSIZE on NPU) and MindSpeed's switches, which
    its adaptor reads (`MINDRL_MINDSPEED_ARGS`)."""
    env = handed.env()
    env.update(mindspeed_args.worker_env(handed.to(MINDSPEED)))
    return env


def worker_env(run: RunConfig, threads: int) -> dict[str, str]:
    """Threads per worker (`roles.threads_per_worker`), the accelerator's allocator settings
    (`Accelerator.worker_env`) and the handed keys (`handed_env`)."""
    env = {"MINDRL_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    acc = get_accelerator(run.runtime.accelerator)
    env.update(acc.worker_env())
    env.update(handed_env(handoffs(run, acc.name)))
    # a joined `ray start` cluster starts workers in its own directory: relative paths in the
    # config (./ckpt) must mean what they mean for the driver
    env["MINDRL_DRIVER_CWD"] = os.getcwd()
    for name in _FORWARDED:
        if name in os.environ:
            env[name] = os.environ[name]
    return env
