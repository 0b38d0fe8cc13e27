"""Rendezvous ports are drawn outside the kernel's range for outgoing connections' source ports,
where any process's next connection could take them before the rendezvous binds."""

from __future__ import annotations

import socket

from mindrl.cluster.calls import LISTEN_PORT_LOW, _outgoing_port_start, free_port


def test_a_free_port_is_below_the_outgoing_range_and_can_be_bound() -> None:
    start = _outgoing_port_start()
    for _ in range(20):
        port = free_port("127.0.0.1")
        if start - 1 - LISTEN_PORT_LOW >= 1000:
            assert LISTEN_PORT_LOW <= port < start
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free: the pick was released
            s.listen()


def test_a_port_in_use_is_never_handed_out() -> None:
    held = []
    try:
        for _ in range(30):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            port = free_port("127.0.0.1")
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
        ports = [s.getsockname()[1] for s in held]
        assert len(set(ports)) == len(ports)
    finally:
        for s in held:
            s.close()
