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
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator

import psutil

_POLL_S = 1.0


def _say(msg: str) -> None:
    print(f"[mindrl.launch] {msg}", flush=True)


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

    ray.init(address=address, log_to_driver=False, logging_level="WARNING")
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
        _say(f"the Ray head at {address} is not up after {head_timeout_s:g} s: {why}")
        return 1
    with ray_connection(address):
        up = time.monotonic()
        deadline = up + timeout_s
        _say(
            f"head {address} up after {up - start:.0f} s; waiting up to {timeout_s:g} s for "
            f"{nodes} node(s) to join"
        )
        seen = -1
        while True:
            alive = alive_nodes()
            names = ", ".join(sorted(_node_label(n) for n in alive)) or "none"
            if len(alive) != seen:
                seen = len(alive)
                _say(
                    f"{seen} of {nodes} node(s) alive after {time.monotonic() - up:.0f} s: {names}"
                )
            if seen >= nodes:
                return 0
            if not _alive(pid):
                _say(f"the head's `ray start` process (pid {pid}) exited")
                return 1
            if time.monotonic() >= deadline:
                _say(
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
        _say(f"no placement seen: {why}")
        return 1
    with ray_connection(address):
        while True:
            snap = placement_snapshot(prefix)
            if len(snap) >= groups:
                nodes = {b["node_id"]: b["node_ip"] for g in snap for b in g["bundles"]}
                print(json.dumps({"groups": snap, "nodes": nodes}), flush=True)
                for g in snap:
                    where = ", ".join(f"#{b['index']}@{b['node_ip']}" for b in g["bundles"])
                    _say(f"{g['name']} ({g['strategy']}): {where}")
                return 0
            if time.monotonic() >= deadline:
                _say(f"{len(snap)} of {groups} placement group(s) {prefix}* after {timeout_s:g} s")
                return 1
            time.sleep(0.5)


# -- processes ------------------------------------------------------------------------------------


def _mentions_temp_dir(cmdline: list[str], temp_dir: str) -> bool:
    """The command line of a Ray process of the node that uses `temp_dir` as its root."""
    session = os.path.join(temp_dir, "session_")
    for i, arg in enumerate(cmdline):
        if session in arg or arg.endswith(f"--temp-dir={temp_dir}"):
            return True
        if arg in ("--temp-dir", "--temp_dir") and i + 1 < len(cmdline):
            if os.path.normpath(cmdline[i + 1]) == temp_dir:
                return True
    return False


def node_processes(temp_dir: str | None, roots: Iterable[int] = ()) -> list[psutil.Process]:
    """The processes of the node(s) a script started, never this process or its ancestors.

    The trees under `roots`; the processes whose command line names `temp_dir`'s sessions; and
    the Ray workers (`ray::...`, whose command line is rewritten) whose `RAY_RAYLET_PID` is one
    of the raylets found so far.
    """
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            found[root.pid] = root
            for child in root.children(recursive=True):
                found[child.pid] = child
    tdir = os.path.normpath(os.path.abspath(temp_dir)) if temp_dir else None
    everyone = list(psutil.process_iter(["pid", "cmdline", "name"]))
    if tdir:
        for proc in everyone:
            cmd = proc.info.get("cmdline") or []
            if proc.pid not in found and _mentions_temp_dir(cmd, tdir):
                found[proc.pid] = proc
    raylets = {str(p.pid) for p in found.values() if _is_raylet(p)}
    if raylets:
        for proc in everyone:
            if proc.pid in found:
                continue
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("RAY_RAYLET_PID") in raylets:
                    found[proc.pid] = proc
    mine = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        mine.update(p.pid for p in psutil.Process().parents())
    return sorted((p for pid, p in found.items() if pid not in mine), key=lambda p: p.pid)


def _is_raylet(proc: psutil.Process) -> bool:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return False
    return bool(cmd) and os.path.basename(cmd[0]) == "raylet"


def stop_node(
    temp_dir: str | None, roots: list[int], grace_s: float = 15.0, record: str | None = None
) -> int:
    """SIGTERM the roots, then every other process found, SIGKILL what outlives `grace_s`.

    `ray start --block` ends its own children on SIGTERM; the sweep catches what it missed.
    The PIDs (with start times) go to `record` so a caller can check afterwards that all are gone.
    Exit status 0 when nothing is left.
    """
    procs = node_processes(temp_dir, roots)
    if record:
        rows = []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                rows.append(f"{p.pid} {p.create_time():.3f} {' '.join(p.cmdline())[:160]}")
        with open(record, "a", encoding="utf-8") as fh:
            fh.write("".join(row + "\n" for row in rows))
    if not procs:
        _say("nothing to stop")
        return 0
    first = [p for p in procs if p.pid in set(roots)]
    _signal(first, signal.SIGTERM)
    alive = _wait_gone(first, grace_s)
    rest = [p for p in procs if p not in first and not _gone(p)]
    _signal(rest, signal.SIGTERM)
    stubborn = alive + _wait_gone(rest, min(grace_s, 5.0))
    _signal(stubborn, signal.SIGKILL)
    left = _wait_gone(stubborn, 5.0)
    _say(
        f"stopped {len(procs)} process(es)"
        + (f", {len(stubborn)} with SIGKILL" if stubborn else "")
        + (f"; still alive: {[p.pid for p in left]}" if left else "")
    )
    return 1 if left else 0


def _gone(proc: psutil.Process) -> bool:
    """Exited (a zombie waiting for its parent to reap it counts as exited)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited or `timeout_s` passed; those still running."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in procs if not _gone(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if not _gone(p)]
    return left


def _signal(procs: Iterable[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)  # psutil refuses a PID that was reused by another process


# -- watchdog -------------------------------------------------------------------------------------

WATCHDOG_STOP = b"stop\n"


def _running(proc: psutil.Process) -> bool:
    """Still running (psutil compares the start time, so a reused PID is not mistaken)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _descendants(procs: Iterable[psutil.Process], exclude: set[int]) -> dict[int, psutil.Process]:
    """`procs` still running plus all their running descendants, minus the PIDs in `exclude`."""
    found: dict[int, psutil.Process] = {}
    for proc in procs:
        if not _running(proc):
            continue
        found.setdefault(proc.pid, proc)
        with contextlib.suppress(psutil.Error):
            for child in proc.children(recursive=True):
                found.setdefault(child.pid, child)
    return {pid: p for pid, p in found.items() if pid not in exclude}


def end_process_tree(
    procs: Iterable[psutil.Process], grace_s: float, exclude: set[int] | None = None
) -> list[psutil.Process]:
    """SIGTERM `procs` and their descendants, SIGKILL what is still there after `grace_s`.

    Returns the processes that were signalled. PIDs in `exclude` are never touched.
    """
    skip = set(exclude or ()) | {os.getpid()}
    targets = _descendants(procs, skip)
    _signal(targets.values(), signal.SIGTERM)
    _wait_gone(list(targets.values()), grace_s)
    # children forked meanwhile, and whatever ignored SIGTERM
    late = _descendants(targets.values(), skip)
    _signal(late.values(), signal.SIGKILL)
    _wait_gone(list(late.values()), 2.0)
    return list({**targets, **late}.values())


def watch_driver(
    pid: int,
    grace_s: float = 2.0,
    poll_s: float = 0.25,
    snapshot_s: float = 1.0,
    stop_fd: int | None = None,
) -> int:
    """Watch driver `pid`; when it is gone, end the processes it had started, by PID.

    The driver's process tree is recorded every `snapshot_s` while it lives (Ray re-parents
    nothing while the driver is up; after a SIGKILL its agents are orphans, found only through
    this record). `stop_fd` (default stdin) is a pipe from the driver: "stop" there means a
    clean shutdown, so nothing is touched. Death is noticed within `poll_s` (EOF on the pipe
    or the PID gone); everything is over within about `grace_s` + 2 s after that.
    """
    try:
        driver = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    me = os.getpid()
    fd = sys.stdin.fileno() if stop_fd is None else stop_fd
    pipe_open = True
    seen: dict[int, psutil.Process] = {}
    next_snapshot = 0.0
    while True:
        if time.monotonic() >= next_snapshot:
            seen = {pid: p for pid, p in seen.items() if _running(p)}  # orphans stay
            with contextlib.suppress(psutil.Error):
                for child in driver.children(recursive=True):
                    if child.pid != me:
                        seen.setdefault(child.pid, child)
            next_snapshot = time.monotonic() + snapshot_s
        if pipe_open:
            ready, _, _ = select.select([fd], [], [], poll_s)
            if ready:
                data = os.read(fd, 4096)
                if WATCHDOG_STOP.strip() in data:
                    return 0
                if not data:
                    pipe_open = False  # the driver closed it: dead, or forked children hold it
        else:
            time.sleep(poll_s)
        if not _running(driver):
            break
    left = [p for p in seen.values() if _running(p)]
    if not left:
        return 0
    stopped = end_process_tree(left, grace_s, exclude={me})
    print(
        f"[mindrl.watchdog] driver pid {pid} is gone: stopped {len(stopped)} process(es) it "
        f"had started",
        file=sys.stderr,
        flush=True,
    )
    return 0


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
