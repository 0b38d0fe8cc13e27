"""Which Ray cluster a run uses: the one a plain `ray.init()` would join, or an embedded one.

Decided without importing Ray (the embedded cluster must set its environment before Ray is
imported), and checked with a TCP probe so a dead or wrong address fails at once in one line
instead of after Ray's long retries.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mindrl.config.run import RuntimeConfig

__all__ = [
    "CURRENT_CLUSTER_FILE",
    "RAY_ADDRESS_ENV",
    "RayConnectError",
    "RayTarget",
    "check_reachable",
    "connect_error",
    "ray_current_cluster_file",
    "resolve_ray_target",
]

RAY_ADDRESS_ENV = "RAY_ADDRESS"
CURRENT_CLUSTER_FILE = "ray_current_cluster"
# A connect to the recorded address answers at once (accepted or refused) on this machine; the
# bound only matters for an address that silently drops packets.
PROBE_TIMEOUT_S = 3.0


class RayConnectError(RuntimeError):
    """The Ray cluster the run was told (or found) to join does not answer; one-line message."""


def ray_current_cluster_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where `ray start` records the cluster a plain `ray.init()` joins.

    Ray 2.60's `ray._common.utils.get_ray_address_file(None)`: RAY_TMPDIR, else TMPDIR on
    Linux, else /tmp; then `ray/ray_current_cluster`. `ray start --temp-dir T` writes
    `T/ray_current_cluster` instead, which `ray.init()` does not read either. Re-implemented so
    deciding does not import Ray (the embedded cluster must set its environment first).
    """
    env = os.environ if environ is None else environ
    if "RAY_TMPDIR" in env:
        base = env["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in env:
        base = env["TMPDIR"]
    elif sys.platform.startswith(("darwin", "linux")):
        base = os.path.join(os.sep, "tmp")
    else:
        base = tempfile.gettempdir()
    return Path(base) / "ray" / CURRENT_CLUSTER_FILE


@dataclass(frozen=True)
class RayTarget:
    """The cluster a run uses: `address` to join, or None for an embedded one; where that
    came from (`source`) and why a recorded cluster was not joined (`note`)."""

    address: str | None
    source: str
    note: str | None = None

    @property
    def embedded(self) -> bool:
        return self.address is None

    def describe(self) -> str:
        """`the running Ray cluster at X (from RAY_ADDRESS)`, or the embedded one and why."""
        if self.address is None:
            return f"an embedded single-node Ray cluster on this machine ({self.source})"
        return f"the running Ray cluster at {self.address} (from {self.source})"

    @property
    def verb(self) -> str:
        return "starting" if self.address is None else "joining"


def _address_probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when something accepts TCP connections at HOST:PORT, else why not."""
    from mindrl.cluster.launch import parse_address, port_open

    if "://" in address:  # ray://, a client server: Ray's own connect reports on it
        return None
    try:
        host, port = parse_address(address)
    except ValueError:
        return f"{address!r} is not HOST:PORT"
    if port_open(host, port, timeout_s=timeout_s):
        return None
    return f"nothing accepts connections at {host}:{port}"


def resolve_ray_target(
    runtime: RuntimeConfig,
    environ: Mapping[str, str] | None = None,
    probe: Callable[[str], str | None] = _address_probe,
) -> RayTarget:
    """Join or start, decided as a plain `ray.init()` would (Ray 2.60,
    `services.get_ray_address_from_environment`), so a MindSpeed-RL workflow -- `ray start
    --head`, then `python cli/train_grpo.py` with no address -- joins that cluster:

    1. `runtime.ray_address` wins: "local" starts an embedded cluster, anything else is joined.
    2. `RAY_ADDRESS` when set and non-empty ("local" again means embedded).
    3. The address `ray start` recorded in `ray_current_cluster_file()`, if that file is this
       user's (on a shared machine /tmp/ray is everybody's: another user's cluster is never
       joined unasked) and something answers there (a file left by a killed cluster is stale).
    4. Otherwise an embedded cluster. Ray's scan for any running GCS process (`address="auto"`
       only) is never used without being asked for.
    """
    env = os.environ if environ is None else environ
    if runtime.ray_address:
        if runtime.ray_address == "local":
            return RayTarget(None, "runtime.ray_address: local")
        return RayTarget(runtime.ray_address, "runtime.ray_address")
    from_env = env.get(RAY_ADDRESS_ENV, "")
    if from_env:
        if from_env == "local":
            return RayTarget(None, f"{RAY_ADDRESS_ENV}=local")
        return RayTarget(from_env, RAY_ADDRESS_ENV)
    path = ray_current_cluster_file(env)
    try:
        recorded = path.read_text().strip()
        owner = path.stat().st_uid
    except OSError:
        return RayTarget(None, f"no {RAY_ADDRESS_ENV} and no {path}")
    if not recorded:
        return RayTarget(None, f"{path} is empty")
    source = f"{path}, written by `ray start`"
    if hasattr(os, "getuid") and owner != os.getuid():
        note = (
            f"not joining the Ray cluster at {recorded} recorded in {path}: that file belongs "
            f"to another user (set {RAY_ADDRESS_ENV} or runtime.ray_address to join it)"
        )
        return RayTarget(None, f"{path} is another user's", note)
    why = probe(recorded)
    if why:
        note = (
            f"not joining the Ray cluster at {recorded} recorded in {path}: {why} (a cluster "
            "that ended without `ray stop` leaves that file behind)"
        )
        return RayTarget(None, f"{path} is stale", note)
    return RayTarget(recorded, source)


def check_reachable(target: RayTarget) -> None:
    """Fail fast, in one line, when the address to join does not answer (Ray itself retries
    for a long while and then raises a multi-line error)."""
    if target.address is None or target.address == "auto":
        return
    why = _address_probe(target.address)
    if why:
        raise RayConnectError(
            f"cannot join the Ray cluster at {target.address} (from {target.source}): {why}"
        )


def connect_error(target: RayTarget, exc: BaseException) -> RayConnectError:
    """Ray's connection failure as one line naming the address and where it came from."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return RayConnectError(
        f"cannot join the Ray cluster at {target.address} (from {target.source}): {first}"
    )
