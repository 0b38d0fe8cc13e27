"""The pieces a worker-group call is made of: method references, payloads shared through
the object store, even data-parallel splits, one-line error reasons and the rendezvous probe.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Union

# A worker method: the function object itself (`ActorWorker.update`, what the role facades
# pass, so a rename breaks at import time) or, for Ray's own methods, its name.
Method = Union[Callable[..., Any], str]

POLL_S = 1.0  # longest single ray.wait: bounds how late a deadline is noticed
SCALARS = (int, float, str, bool, type(None))


def split_evenly(items: Sequence, parts: int) -> list[Sequence]:
    """`parts` contiguous equal slices of `items` (lists, tuples, tensors along dim 0)."""
    n = len(items)
    if parts < 1 or n % parts:
        raise ValueError(
            f"cannot split {n} items evenly over {parts} data-parallel rank(s); make the batch "
            f"a multiple of the data-parallel size"
        )
    size = n // parts
    return [items[i * size : (i + 1) * size] for i in range(parts)]


# The lowest port a listening rendezvous is drawn from. Ports the kernel hands out itself (bind
# to port 0) come from its range for the source ports of outgoing connections, so any process's
# next connection can take one between the pick and the rendezvous's bind (EADDRINUSE); ports
# drawn between this and the start of that range (and above Ray's worker ports) are not.
LISTEN_PORT_LOW = 20000
_LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _outgoing_port_start() -> int:
    """The first port of the kernel's range for outgoing connections (Linux's default where it
    cannot be read)."""
    try:
        return int(_LOCAL_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "") -> int:
    """A TCP port free on `host` (every interface by default) right now, for a rendezvous to
    bind next: drawn below the kernel's range for outgoing connections where there is room,
    else the kernel's pick."""
    high = _outgoing_port_start() - 1
    if high - LISTEN_PORT_LOW >= 1000:
        draw = random.SystemRandom()
        for _ in range(64):
            port = draw.randint(LISTEN_PORT_LOW, high)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def probe_node() -> tuple[str, int]:
    """Runs on rank 0's bundle: that node's IP (as Ray knows it) and a port free there."""
    import ray

    return ray.util.get_node_ip_address(), free_port()


def share(value: Any) -> Any:
    """An object-store reference for a payload several ranks receive (scalars stay inline)."""
    import ray

    if isinstance(value, (*SCALARS, ray.ObjectRef)):
        return value
    return ray.put(value)


def error_reason(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ".join(lines) or type(exc).__name__
    return text if len(text) <= 1200 else text[:1200] + " ..."
