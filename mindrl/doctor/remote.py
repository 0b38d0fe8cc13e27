"""Ray tasks for the doctor: a function from this package run on a chosen node or bundle, with
a device where the accelerator has them, and a bounded wait for its answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mindrl.accelerator import Accelerator


class ProbeTimeout(RuntimeError):
    """A probe did not answer within its bound (it was cancelled)."""


@dataclass(frozen=True)
class Where:
    """Where a task runs: a node (by Ray node id) or a placement group's bundle."""

    node_id: str | None = None
    placement_group: Any = None
    bundle: int = 0


def submit(
    acc: Accelerator,
    fn: Callable[..., Any],
    *args: Any,
    where: Where,
    device: bool = False,
    fresh: bool = False,
) -> Any:
    """Start `fn(*args)` as a Ray task; returns its object ref.

    No CPU is reserved (the doctor must run beside a run's reservation and on a one-CPU node);
    `device`: one accelerator device (Ray sets the visible-devices variable); `fresh`: the
    worker process exits after the task (megatron's and vLLM's global state die with it).
    """
    import ray
    from ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )

    options: dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
    if device and acc.name == "cuda":
        options["num_gpus"] = 1
    elif device and not acc.is_cpu:
        options["resources"] = {acc.ray_resource: 1}
    if where.placement_group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            where.placement_group, placement_group_bundle_index=where.bundle
        )
    elif where.node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(where.node_id, soft=False)
    task = ray.remote(max_calls=1)(fn) if fresh else ray.remote(fn)
    return task.options(**options).remote(*args)


def wait_all(refs: Sequence[Any], timeout_s: float, what: str) -> list[Any]:
    """The tasks' results; cancels them all and raises `ProbeTimeout` past `timeout_s`."""
    import ray

    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    if pending:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise ProbeTimeout(
            f"{what}: {len(pending)} of {len(refs)} task(s) gave no answer in {timeout_s:.0f} s"
        )
    return list(ray.get(list(refs)))


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    resources: dict[str, float]

    def devices(self, acc: Accelerator) -> int:
        return int(self.resources.get(acc.ray_resource, 0.0)) if not acc.is_cpu else 0


def cluster_nodes() -> list[NodeInfo]:
    """The alive nodes, the driver's node first."""
    import ray

    from mindrl.cluster.ray_cluster import alive_nodes

    here = ray.get_runtime_context().get_node_id()
    nodes = [
        NodeInfo(
            n["NodeID"], n["NodeManagerAddress"], {k: float(v) for k, v in n["Resources"].items()}
        )
        for n in alive_nodes()
    ]
    return sorted(nodes, key=lambda n: n.node_id != here)
