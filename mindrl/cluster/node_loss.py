"""Which Ray nodes hold which role ranks of this run, and whether any of them died.

A node that dies (its raylet killed, the machine gone) is declared dead by Ray's control
plane after its health checks fail (`RAY_health_check_period_ms` x
`RAY_health_check_failure_threshold`, each check bounded by `RAY_health_check_timeout_ms`, read
by the head's GCS). The driver's waits (`WorkerGroup.gather`) look at the nodes their
groups run on once per `POLL_S`, so a lost node ends the run by name at most `POLL_S` after
Ray declares it dead, whichever role's call is in flight, instead of surfacing later as one
rank's "actor died".
"""

from __future__ import annotations

import socket
import weakref
from dataclasses import dataclass
from typing import Protocol


class PlacedGroup(Protocol):
    """What the registry needs of a worker group: its role and each rank's node id."""

    role: str
    node_ids: list[str]


# The driver's live worker groups; a group leaves when it is shut down or collected.
_GROUPS: weakref.WeakSet = weakref.WeakSet()


def register(group: PlacedGroup) -> None:
    _GROUPS.add(group)


def unregister(group: PlacedGroup) -> None:
    _GROUPS.discard(group)


def held_by(node_id: str, groups: list[PlacedGroup] | None = None) -> tuple[str, ...]:
    """`("actor rank 0", "ref rank 0")`: the role ranks of the live groups placed on the node."""
    out = []
    for group in sorted(_GROUPS if groups is None else groups, key=lambda g: g.role):
        ranks = [str(r) for r, node in enumerate(group.node_ids) if node == node_id]
        if ranks:
            out.append(f"{group.role} rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)}")
    return tuple(out)


@dataclass(frozen=True)
class DeadNode:
    node_id: str
    ip: str
    reason: str  # Ray's death cause where it gives one


def placed_nodes() -> set[str]:
    return {node for group in list(_GROUPS) for node in group.node_ids if node}


RAYLET_PROBE_S = 1.0  # a live raylet accepts a connection at once; a dead one refuses it


def raylet_answers(ip: str, port: int, timeout_s: float = RAYLET_PROBE_S) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def dead_nodes(node_ids: set[str], probe_raylets: bool = False) -> list[DeadNode]:
    """The nodes among `node_ids` that Ray's control plane reports dead; with `probe_raylets`
    also those whose raylet refuses a connection (a worker's call that failed because its peer
    on that node vanished is noticed before Ray's health checks declare the node dead). None
    when the control plane cannot be asked: the caller's own wait then reports what it sees."""
    if not node_ids:
        return []
    import ray

    try:
        nodes = ray.nodes()
    except Exception:  # the control plane itself is unreachable: not a node's death
        return []
    out = []
    for node in nodes:
        node_id, ip = node.get("NodeID"), str(node.get("NodeManagerAddress", "?"))
        if node_id not in node_ids:
            continue
        if not node.get("Alive", True):
            reason = str(node.get("DeathReasonMessage") or "Ray declared the node dead")
            out.append(DeadNode(node_id, ip, reason))
        elif probe_raylets and not raylet_answers(ip, int(node.get("NodeManagerPort", 0))):
            port = node.get("NodeManagerPort")
            reason = (
                f"its raylet at {ip}:{port} refuses connections (Ray has not declared it dead yet)"
            )
            out.append(DeadNode(node_id, ip, reason))
    return sorted(out, key=lambda n: n.node_id)
