"""Ports on this machine for tests that need one nothing listens on: no test reaches past
loopback.

``OTHER_LOOPBACK`` (127.0.0.2) is on this machine's loopback (Linux routes all of 127.0.0.0/8
to ``lo``) but is not a host mindrl's embedded tool servers stand in for (they serve
localhost / 127.0.0.1 / ::1 only): a URL there stands for "a remote service that is down",
refused at once, without a packet leaving the machine.
"""

from __future__ import annotations

import socket

OTHER_LOOPBACK = "127.0.0.2"


def unused_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listened on a moment ago (bound, read, closed)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])
