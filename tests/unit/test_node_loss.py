"""Naming a lost Ray node: which role ranks it held, how a dead raylet is told from a live one,
and the one-line error the run ends with. The two-node run itself is
tests/reliability/test_lost_node.py."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from mindrl.cluster import node_loss
from mindrl.cluster.errors import NodeLost, WorkerFailure
from mindrl.cluster.node_loss import held_by, raylet_answers


@dataclass(eq=False)
class Placed:
    role: str
    node_ids: list[str] = field(default_factory=list)


def test_held_by_lists_every_role_rank_on_the_node():
    actor = Placed("actor", ["head", "second", "second"])
    ref = Placed("ref", ["head", "head", "head"])
    rollout = Placed("rollout", ["second"])
    groups = [rollout, ref, actor]
    assert held_by("second", groups) == ("actor ranks 1, 2", "rollout rank 0")
    assert held_by("head", groups) == ("actor rank 0", "ref ranks 0, 1, 2")
    assert held_by("elsewhere", groups) == ()


def test_registered_groups_leave_when_unregistered():
    group = Placed("rollout", ["n1"])
    node_loss.register(group)
    try:
        assert "rollout rank 0" in held_by("n1")
        assert "n1" in node_loss.placed_nodes()
    finally:
        node_loss.unregister(group)
    assert held_by("n1") == ()


def test_a_refusing_raylet_port_is_told_from_a_listening_one():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert raylet_answers("127.0.0.1", port)
    assert not raylet_answers("127.0.0.1", port)  # closed now: refused at once


def test_the_error_names_the_node_and_what_it_held():
    exc = NodeLost(
        "rollout",
        0,
        "127.0.0.3",
        "ab12cd",
        ("rollout rank 0",),
        "health check failed for node",
        "generate",
    )
    assert isinstance(exc, WorkerFailure)  # the run's worker-failure handling applies
    assert str(exc) == (
        "lost Ray node 127.0.0.3 (node id ab12cd) during generate(): it held rollout rank 0; "
        "health check failed for node"
    )
