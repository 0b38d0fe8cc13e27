"""What the cluster offers: read from a running Ray cluster, or predicted for an embedded one."""

from __future__ import annotations

import os

from mindrl.accelerator import Accelerator
from mindrl.cluster.placement import ClusterResources


def embedded_cluster_resources(acc: Accelerator, num_cpus: int | None = None) -> ClusterResources:
    """The single node an embedded `ray.init()` on this machine would offer."""
    node: dict[str, float] = {"CPU": float(num_cpus or os.cpu_count() or 1)}
    if not acc.is_cpu:
        node[acc.ray_resource] = float(acc.device_count())
    return ClusterResources(nodes=(node,))


def running_cluster_resources(address: str) -> ClusterResources:
    """Per-node resources of the Ray cluster at `address` (connects; starts nothing)."""
    import ray

    from mindrl.cluster.ray_cluster import use_token_auth_for_address

    started_here = not ray.is_initialized()
    if started_here:
        use_token_auth_for_address(address)
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        nodes = tuple(
            {k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n["Alive"]
        )
    finally:
        if started_here:
            ray.shutdown()
    return ClusterResources(nodes=nodes)
