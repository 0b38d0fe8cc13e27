"""A two-sided gloo group outside torch.distributed's default world: the trainer's end and a
rollout server's workers meet over a TCPStore and exchange weight bytes by broadcast.

Neither side touches the process's default group (a vLLM worker already has one of its own),
so the group is built from the store directly. The store listens on the rendezvous address
only; a loopback address keeps the group's connections on 127.0.0.1 too, and off loopback
the trainer's end of the group binds that address as well. Who may join: `weight_admission`.
"""

from __future__ import annotations

import datetime
import ipaddress
from typing import Any

import torch

PREFIX = "mindrl-weights"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_store(host: str, port: int, world_size: int, *, master: bool, timeout_s: float) -> Any:
    """The rendezvous store; the master listens on `host` only (port 0: a free port, read
    back from ``store.port``), as the training ranks' store does (`rendezvous_store`)."""
    from mindrl.models.parallel import rendezvous_store

    rank = 0 if master else 1
    timeout = datetime.timedelta(seconds=timeout_s)
    # the trainer's store opens first: the servers learn its port from the join request
    return rendezvous_store(host, port, rank, world_size, timeout, wait_for_workers=False)


def open_group(store: Any, rank: int, world_size: int, host: str, timeout_s: float) -> Any:
    """A gloo group of `world_size` over `store`; blocks until every rank has joined."""
    import torch.distributed as dist

    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private in torch
    options._timeout = datetime.timedelta(seconds=timeout_s)
    if _is_loopback(host):
        device = dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")
    elif rank == 0:  # the trainer's connections on the address the run chose for it too
        device = dist.ProcessGroupGloo.create_device(hostname=host)
    else:
        device = dist.ProcessGroupGloo.create_default_device()
    options._devices = [device]
    return dist.ProcessGroupGloo(dist.PrefixStore(PREFIX, store), rank, world_size, options)


def broadcast_bytes(group: Any, buffer: torch.Tensor) -> None:
    """Rank 0's `buffer` into every other rank's (same size), in place."""
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([buffer], options).wait()
