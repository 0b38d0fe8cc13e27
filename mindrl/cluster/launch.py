"""What the multi-node launch scripts (`examples/launch/{master,worker}.sh`) cannot do well in bash.

    python -m mindrl.cluster.launch wait-nodes --address HOST:PORT --nodes N --timeout T [--pid P]
    python -m mindrl.cluster.launch placement --address HOST:PORT --groups G --timeout T
    python -m mindrl.cluster.launch node-pids --temp-dir DIR [--root-pid P ...]
    python -m mindrl.cluster.launch stop --temp-dir DIR --root-pid P [--grace S] [--record FILE]
    python -m mindrl.cluster.launch detect-devices [--type auto|npu|gpu|cpu]
    python -m mindrl.cluster.launch node-ip
    python -m mindrl.cluster.launch watchdog --pid DRIVER [--grace S]   (stdin: a pipe)

`stop` ends only the processes a script started: the process trees under the PIDs the script
launched (`ray start --block`, the driver), plus the Ray processes whose command line names the
node's own `--temp-dir` (a folder the script dedicates to that node), plus the Ray workers whose
raylet is one of those. `ray stop` is never used: it ends every Ray process of the user on the
machine, other people's clusters included.

`watchdog` is started by a driver that runs an embedded Ray cluster (`start_or_connect`): it
remembers the driver's process tree and, when the driver disappears without saying "stop" on
the pipe (SIGKILL, OOM killer), ends that tree by PID. Ray's agents would otherwise outlive a
killed driver by minutes (they try to report the raylet's death to the dead GCS first).

Every wait is bounded by its timeout; Ray is imported only by the subcommands that connect.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil

from mindrl.cluster.processes import (
    node_processes,
    say,
    stop_node,
    watch_driver,
)

_POLL_S = 1.0


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` -> (host, port); IPv6 hosts may be bracketed."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def port_open(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """True when a TCP connection to host:port succeeds within `timeout_s`."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        proc = psutil.Process(pid)
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for_port(address: str, deadline: float, pid: int | None = None) -> str | None:
    """Wait until the head's GCS port answers; the reason it did not, or None when it did."""
    host, port = parse_address(address)
    while True:
        if port_open(host, port, timeout_s=min(2.0, max(deadline - time.monotonic(), 0.1))):
            return None
        if not _alive(pid):
            return f"the `ray start` process (pid {pid}) exited before {address} answered"
        if time.monotonic() >= deadline:
            return f"nothing answers at {address}"
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0.0)))


@contextlib.contextmanager
def ray_connection(address: str) -> Iterator[None]:
    """A short-lived driver connection (`ray.init(address=...)`), always disconnected after."""
    import ray

    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    # a launch script stops its waiting helper with SIGTERM: leave quietly, disconnecting first
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        yield
    finally:
        ray.shutdown()


def _node_label(node: dict) -> str:
    ip = node.get("NodeManagerAddress", "?")
    head = node.get("Resources", {}).get("node:__internal_head__")
    return f"{ip} (head)" if head else str(ip)


def alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


# -- wait-nodes -----------------------------------------------------------------------------------


def wait_nodes(
    address: str,
    nodes: int,
    timeout_s: float,
    pid: int | None = None,
    head_timeout_s: float = 180.0,
    poll_s: float = _POLL_S,
) -> int:
    """Exit status 0 once `nodes` Ray nodes are alive at `address`, 1 when they are not in time.

    Two clocks: the head itself gets `head_timeout_s` to answer (its start-up is no worker's
    fault), then the other nodes get `timeout_s` to join. `pid` is the head's `ray start`
    process: if it dies, waiting stops at once.
    """
    start = time.monotonic()
    why = wait_for_port(address, start + head_timeout_s, pid)
    if why is not None:
        say(f"the Ray head at {address} is not up after {head_timeout_s:g} s: {why}")
        return 1
    with ray_connection(address):
        up = time.monotonic()
        deadline = up + timeout_s
        say(
            f"head {address} up after {up - start:.0f} s; waiting up to {timeout_s:g} s for "
            f"{nodes} node(s) to join"
        )
        seen = -1
        while True:
            alive = alive_nodes()
            names = ", ".join(sorted(_node_label(n) for n in alive)) or "none"
            if len(alive) != seen:
                seen = len(alive)
                say(f"{seen} of {nodes} node(s) alive after {time.monotonic() - up:.0f} s: {names}")
            if seen >= nodes:
                return 0
            if not _alive(pid):
                say(f"the head's `ray start` process (pid {pid}) exited")
                return 1
            if time.monotonic() >= deadline:
                say(
                    f"only {seen} of {nodes} nodes joined after {timeout_s:g} s: alive {names}. "
                    f"Start examples/launch/worker.sh on each missing node with "
                    f"MASTER_ADDR/MASTER_PORT pointing at {address} (same Ray version, same "
                    f"auth token), or lower NNODES."
                )
                return 1
            time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.05)))


# -- placement ------------------------------------------------------------------------------------


def placement_snapshot(prefix: str = "mindrl:") -> list[dict]:
    """The created placement groups named `prefix*`, each bundle with its node's id and IP."""
    from ray.util.placement_group import placement_group_table

    ip_of = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in alive_nodes()}
    out = []
    for info in placement_group_table().values():
        name = info.get("name") or ""
        if not name.startswith(prefix) or info.get("state") != "CREATED":
            continue
        where = info.get("bundles_to_node_id", {})
        bundles = [
            {"index": int(i), "node_id": nid, "node_ip": ip_of.get(nid, "?")}
            for i, nid in sorted(where.items(), key=lambda kv: int(kv[0]))
        ]
        out.append({"name": name, "strategy": info.get("strategy"), "bundles": bundles})
    return sorted(out, key=lambda g: g["name"])


def wait_placement(address: str, groups: int, timeout_s: float, prefix: str = "mindrl:") -> int:
    """Print (JSON, one line) the run's placement groups once `groups` of them are created."""
    deadline = time.monotonic() + timeout_s
    why = wait_for_port(address, deadline)
    if why is not None:
        say(f"no placement seen: {why}")
        return 1
    with ray_connection(address):
        while True:
            snap = placement_snapshot(prefix)
            if len(snap) >= groups:
                nodes = {b["node_id"]: b["node_ip"] for g in snap for b in g["bundles"]}
                print(json.dumps({"groups": snap, "nodes": nodes}), flush=True)
                for g in snap:
                    where = ", ".join(f"#{b['index']}@{b['node_ip']}" for b in g["bundles"])
                    say(f"{g['name']} ({g['strategy']}): {where}")
                return 0
            if time.monotonic() >= deadline:
                say(f"{len(snap)} of {groups} placement group(s) {prefix}* after {timeout_s:g} s")
                return 1
            time.sleep(0.5)


# -- devices --------------------------------------------------------------------------------------


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _visible(env: str) -> int | None:
    value = os.environ.get(env, "").strip()
    return len([v for v in value.split(",") if v.strip()]) if value else None


def count_npus() -> int:
    """Ascend NPUs: ASCEND_RT_VISIBLE_DEVICES, else `npu-smi info -l`, else torch_npu."""
    visible = _visible("ASCEND_RT_VISIBLE_DEVICES")
    if visible is not None:
        return visible
    if shutil.which("npu-smi"):
        m = re.search(r"Total Count\s*:\s*(\d+)", _run(["npu-smi", "info", "-l"]))
        if m:
            return int(m.group(1))
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        with contextlib.suppress(Exception):
            from mindrl.accelerator import get_accelerator

            return int(get_accelerator("npu").device_count())
    return 0


def count_gpus() -> int:
    """NVIDIA GPUs: CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`."""
    visible = _visible("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return visible
    if shutil.which("nvidia-smi"):
        return sum(line.startswith("GPU ") for line in _run(["nvidia-smi", "-L"]).splitlines())
    return 0


def count_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def detect_devices(kind: str = "auto") -> tuple[str, int]:
    """(type, count) for this node: npu if any NPU is found, else gpu, else cpu."""
    counters = {"npu": count_npus, "gpu": count_gpus, "cpu": count_cpus}
    if kind != "auto":
        return kind, counters[kind]()
    for name in ("npu", "gpu"):
        n = counters[name]()
        if n > 0:
            return name, n
    return "cpu", count_cpus()


def node_ip() -> str:
    """The IP Ray would report for this node (the interface of the default route)."""
    import ray.util

    return ray.util.get_node_ip_address()


# -- command line ---------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mindrl.cluster.launch", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    w = sub.add_parser("wait-nodes", help="wait until N nodes are alive (exit 1 on timeout)")
    w.add_argument("--address", required=True, help="the head's HOST:PORT")
    w.add_argument("--nodes", type=int, required=True)
    w.add_argument("--timeout", type=float, required=True, help="seconds")
    w.add_argument("--pid", type=int, default=None, help="the head's `ray start` process")
    w.add_argument("--head-timeout", type=float, default=180.0, help="seconds for the head")

    pl = sub.add_parser("placement", help="print where the run's placement groups landed")
    pl.add_argument("--address", required=True)
    pl.add_argument("--groups", type=int, default=1, help="wait for this many groups")
    pl.add_argument("--timeout", type=float, default=60.0)
    pl.add_argument("--prefix", default="mindrl:")

    for name, helptext in (
        ("node-pids", "list the processes of a node started with --temp-dir DIR"),
        ("stop", "stop exactly those processes (SIGTERM, then SIGKILL after --grace)"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--temp-dir", default=None, help="the node's dedicated `ray start` dir")
        s.add_argument("--root-pid", type=int, action="append", default=[], help="repeatable")
        if name == "stop":
            s.add_argument("--grace", type=float, default=15.0, help="seconds before SIGKILL")
            s.add_argument("--record", default=None, help="append the PIDs stopped to this file")

    d = sub.add_parser("detect-devices", help="print 'TYPE COUNT' for this node")
    d.add_argument("--type", default="auto", choices=("auto", "npu", "gpu", "cpu"))

    sub.add_parser("node-ip", help="print this node's IP as Ray sees it")

    wd = sub.add_parser("watchdog", help="end a driver's process tree when the driver dies")
    wd.add_argument("--pid", type=int, required=True, help="the driver to watch")
    wd.add_argument("--grace", type=float, default=2.0, help="seconds between SIGTERM and SIGKILL")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "wait-nodes":
        return wait_nodes(args.address, args.nodes, args.timeout, args.pid, args.head_timeout)
    if args.cmd == "placement":
        return wait_placement(args.address, args.groups, args.timeout, args.prefix)
    if args.cmd == "node-pids":
        if not args.temp_dir and not args.root_pid:
            raise SystemExit("node-pids: give --temp-dir and/or --root-pid")
        for proc in node_processes(args.temp_dir, args.root_pid):
            print(proc.pid)
        return 0
    if args.cmd == "stop":
        if not args.temp_dir and not args.root_pid:
            raise SystemExit("stop: give --temp-dir and/or --root-pid")
        return stop_node(args.temp_dir, args.root_pid, args.grace, args.record)
    if args.cmd == "detect-devices":
        kind, count = detect_devices(args.type)
        print(kind, count)
        return 0
    if args.cmd == "node-ip":
        print(node_ip())
        return 0
    if args.cmd == "watchdog":
        return watch_driver(args.pid, grace_s=args.grace)
    return 2


if __name__ == "__main__":
    sys.exit(main())
