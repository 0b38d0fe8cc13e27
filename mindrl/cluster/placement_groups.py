"""Reserve one Ray placement group per device group of a `PlacementPlan`, bounded in time.

A group that cannot be reserved is removed again (with every group reserved before it) and the
error names the group, the bundles it asked for and what the cluster has left, instead of Ray's
silent "pending forever".
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from mindrl.cluster.errors import PlacementGroupTimeout
from mindrl.cluster.placement import DeviceGroup, PlacementPlan, RoleLayout

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup


def _fmt(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if not k.startswith(("node:", "memory"))}
    shown = {k: v for k, v in shown.items() if k != "object_store_memory"}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items())) + "}"


def _cluster_summary() -> str:
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    per_node = "; ".join(
        f"{n.get('NodeManagerAddress', '?')} {_fmt(n['Resources'])}" for n in nodes
    )
    return (
        f"cluster available {_fmt(ray.available_resources())}, total "
        f"{_fmt(ray.cluster_resources())} over {len(nodes)} node(s) [{per_node}]"
    )


def create_placement_group(group: DeviceGroup, timeout_s: float) -> PlacementGroup:
    """Reserve `group.num_devices` bundles of `group.bundle` with `group.strategy`; wait."""
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [dict(group.bundle) for _ in range(group.num_devices)]
    pg = placement_group(
        bundles, strategy=group.strategy, name=f"mindrl:{group.name}:{uuid.uuid4().hex[:8]}"
    )
    start = time.monotonic()
    if pg.wait(timeout_seconds=timeout_s):
        return pg
    summary = _cluster_summary()
    remove_placement_group(pg)
    raise PlacementGroupTimeout(
        f"placement group for {group.name!r} not ready after {time.monotonic() - start:.0f} s: "
        f"asked {group.num_devices} bundle(s) of {_fmt(group.bundle)} with {group.strategy}; "
        f"{summary}. Lower rl_config.*_resource / num_cpus_for_placement_group, or add nodes."
    )


def create_placement_groups(plan: PlacementPlan, timeout_s: float) -> dict[str, PlacementGroup]:
    """One ready placement group per device group, keyed by `DeviceGroup.name`.

    On failure the groups already reserved are removed, so a failed start leaks no reservation.
    """
    out: dict[str, PlacementGroup] = {}
    try:
        for group in plan.groups:
            out[group.name] = create_placement_group(group, timeout_s)
    except BaseException:
        remove_placement_groups(out)
        raise
    return out


def describe_bundle_nodes(pgs: dict[str, PlacementGroup]) -> str:
    """Which node each bundle of each placement group landed on (for the driver's log)."""
    import ray
    from ray.util.placement_group import placement_group_table

    ip_of = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    lines = ["placement on the cluster:"]
    for name, pg in pgs.items():
        nodes = placement_group_table(pg).get("bundles_to_node_id", {})
        where = ", ".join(
            f"bundle {i} -> {ip_of.get(node, '?')} ({str(node)[:8]})"
            for i, node in sorted(nodes.items())
        )
        lines.append(f"  {name}: {where}")
    return "\n".join(lines)


def remove_placement_groups(pgs: dict[str, PlacementGroup], timeout_s: float = 10.0) -> None:
    """Release the reservations (safe on groups that are already removed).

    Bounded: Ray's call waits for its control plane without a timeout, and when the cluster
    is already going down (a stop signal reached its processes) nothing is left to release;
    the call then runs out in a daemon thread instead of holding the driver.
    """
    import threading

    from ray.util.placement_group import remove_placement_group

    def release() -> None:
        for pg in list(pgs.values()):
            try:
                remove_placement_group(pg)
            except Exception:  # already removed or the cluster is gone: nothing to release
                pass

    worker = threading.Thread(target=release, name="remove-placement-groups", daemon=True)
    worker.start()
    worker.join(timeout_s)
    pgs.clear()


# -- how the roles of one device group share its bundles ----------------------------------------


def bundle_indices(group: DeviceGroup, role: str) -> list[int]:
    """Bundles the role's ranks run on: rank i on bundle i (colocated roles reuse the same)."""
    layout = _role(group, role)
    return list(range(layout.num_devices))


def cpus_per_worker(group: DeviceGroup) -> float:
    """A bundle's CPUs split between the roles colocated on it (fractions are fine in Ray)."""
    return float(group.bundle.get("CPU", 0.0)) / len(group.roles)


def devices_per_worker(group: DeviceGroup, resource: str) -> float:
    """A bundle's device split between the colocated roles (0 on a CPU box)."""
    if resource == "CPU":
        return 0.0
    return float(group.bundle.get(resource, 0.0)) / len(group.roles)


def _role(group: DeviceGroup, role: str) -> RoleLayout:
    for layout in group.roles:
        if layout.role == role:
            return layout
    raise KeyError(f"role {role!r} is not in device group {group.name!r}")
