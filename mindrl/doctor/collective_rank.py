"""One rank of the doctor's collective check: all-reduce and all-gather over the accelerator's
backend, results verified, bus bandwidth measured. Runs in a Ray task (one per rank)."""

from __future__ import annotations

import time
from typing import Any

REPEATS = 5


def run_collective_rank(
    rank: int, world: int, master: str, port: int, accelerator: str, nbytes: int
) -> dict[str, Any]:
    """Join a `world`-rank group at master:port, run the collectives, leave the group.

    Bus bandwidth follows the usual convention (nccl-tests): all-reduce moves
    2 (n-1)/n of the buffer per rank, all-gather (n-1)/n of the gathered buffer."""
    import torch
    import torch.distributed as dist

    from mindrl.accelerator import get_accelerator

    acc = get_accelerator(accelerator)
    acc.set_device(0)  # Ray gives each rank's task its own device as device 0
    device = acc.device(0)
    dist.init_process_group(
        acc.dist_backend, init_method=f"tcp://{master}:{port}", rank=rank, world_size=world
    )
    try:
        numel = max(1, nbytes // 4)
        value = torch.full((numel,), float(rank + 1), device=device)
        dist.all_reduce(value)  # warm-up, and the check of the sum
        expected = world * (world + 1) / 2
        reduce_ok = bool(torch.all(value == expected).item())
        acc.synchronize()
        start = time.perf_counter()
        for _ in range(REPEATS):
            dist.all_reduce(value)
        acc.synchronize()
        reduce_s = (time.perf_counter() - start) / REPEATS
        part = torch.full((numel // world or 1,), float(rank), device=device)
        parts = [torch.empty_like(part) for _ in range(world)]
        dist.all_gather(parts, part)
        gather_ok = all(bool(torch.all(p == i).item()) for i, p in enumerate(parts))
        acc.synchronize()
        start = time.perf_counter()
        for _ in range(REPEATS):
            dist.all_gather(parts, part)
        acc.synchronize()
        gather_s = (time.perf_counter() - start) / REPEATS
        gathered_bytes = part.numel() * 4 * world
        return {
            "rank": rank,
            "backend": acc.dist_backend,
            "all_reduce_ok": reduce_ok,
            "all_gather_ok": gather_ok,
            "all_reduce_busbw_gbps": numel * 4 / reduce_s * 2 * (world - 1) / world / 1e9,
            "all_gather_busbw_gbps": gathered_bytes / gather_s * (world - 1) / world / 1e9,
        }
    finally:
        dist.destroy_process_group()
