"""The embedded Ray cluster listens on loopback only: no Ray process is reachable from the network.

A fresh driver process starts the cluster exactly as the trainer does (`start_or_connect` with
no `runtime.ray_address`), runs a two-rank worker group of mindrl `Worker`s on a placement
group, and (in one case) builds a real vLLM engine in one of those workers and generates with
it. While everything is up, every listening TCP socket of the driver's process tree (GCS,
raylet with its object manager, dashboard, dashboard and runtime-env agents, metrics exporters,
core workers, the vLLM engine) must have a loopback local address: 127.0.0.0/8 or ::1
(also as an IPv4-mapped ::ffff:127.x). Every wait is bounded by a configured timeout; the
driver's processes are ended by PID.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from mindrl.cluster.ray_cluster import is_loopback

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300.0  # Ray start-up + two workers (+ a vLLM engine) on a busy 2-core box
STOP_TIMEOUT_S = 60.0  # clean shutdown of the cluster after the check
KILL_WAIT_S = 10.0  # SIGKILLed leftovers must be reaped within this

DRIVER = textwrap.dedent(
    """
    import json, os, sys

    from mindrl.accelerator import get_accelerator
    from mindrl.cluster.placement import DeviceGroup, PlacementPlan, RoleLayout
    from mindrl.cluster.placement_groups import create_placement_groups, remove_placement_groups
    from mindrl.cluster.ray_cluster import start_or_connect
    from mindrl.cluster.worker import Worker
    from mindrl.cluster.worker_group import WorkerGroup
    from mindrl.config.run import RuntimeConfig

    class Probe(Worker):
        def engine(self, model_dir: str) -> int:
            from mindrl.rollout.base import RolloutSampling
            from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

            opts = VLLMEngineOptions(dtype="float32", max_model_len=128, max_num_seqs=4)
            self._engine = VLLMRolloutEngine(model_dir, opts, accelerator="cpu")
            sampling = RolloutSampling(max_tokens=4, seed=0, ignore_eos=True)
            out = self._engine.generate([[1, 2, 3]], sampling)
            return len(out[0].token_ids)

    dashboard, model_dir, timeout = sys.argv[1] == "1", sys.argv[2], float(sys.argv[3])
    runtime = RuntimeConfig(ray_num_cpus=2, ray_dashboard=dashboard)
    with start_or_connect(runtime, get_accelerator("cpu")) as cluster:
        import ray

        group = DeviceGroup("probe", (RoleLayout("probe", 2, 1, 1, 2),), 2, {"CPU": 1.0}, "PACK")
        pgs = create_placement_groups(PlacementPlan("CPU", (group,)), timeout_s=timeout)
        wg = WorkerGroup(
            Probe, "probe", pgs["probe"], [0, 1], master_addr=cluster.master_addr,
            timeout_s=timeout,
        )
        tokens = wg.execute_rank(0, "engine", model_dir) if model_dir else None
        info = {
            "node_ip": ray.util.get_node_ip_address(),
            "gcs": cluster.gcs_address,
            "workers": wg.execute_all("pid"),
            "tokens": tokens,
        }
        print("READY " + json.dumps(info), flush=True)
        sys.stdin.readline()  # the test has looked at the sockets
        wg.shutdown()
        remove_placement_groups(pgs)
    print("STOPPED", flush=True)
    """
)


def _lines(stream) -> queue.Queue:
    """The stream's lines on a queue (None at EOF), so reads can be bounded by a deadline."""
    q: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(lines: queue.Queue, prefix: str, timeout_s: float) -> str | None:
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            return None
        if line is None:
            return None
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return None


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _listening(procs: list[psutil.Process]) -> list[tuple[int, str, str, int]]:
    """(pid, process name, local ip, port) of every listening TCP socket of `procs`."""
    out = []
    for proc in procs:
        try:
            name = proc.name()
            conns = proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                out.append((proc.pid, name, c.laddr.ip, c.laddr.port))
    return out


def _kill_tree(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)  # psutil refuses a reused PID
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=KILL_WAIT_S)


@pytest.mark.parametrize(
    "dashboard, engine",
    [
        pytest.param(False, True, marks=pytest.mark.vllm, id="workers+vllm"),
        pytest.param(True, False, id="dashboard"),
    ],
)
def test_embedded_cluster_listens_on_loopback_only(tmp_path, tiny_model_dir, dashboard, engine):
    if engine:
        pytest.importorskip("vllm")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)
    stderr = tmp_path / "driver.stderr"
    cmd = [sys.executable, "-c", DRIVER, "1" if dashboard else "0"]
    cmd += [str(tiny_model_dir) if engine else "", str(START_TIMEOUT_S)]
    with open(stderr, "w") as err:
        driver = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=ROOT,
            env=env,
        )
    lines = _lines(driver.stdout)
    seen: list[psutil.Process] = []
    try:
        ready = _wait_for(lines, "READY ", START_TIMEOUT_S)
        assert ready is not None, stderr.read_text()[-4000:]
        info = json.loads(ready)
        seen = _tree(driver.pid)
        listening = _listening(seen)
        print("\n".join(f"{pid:>7} {name:<24} {ip}:{port}" for pid, name, ip, port in listening))

        assert info["node_ip"] == "127.0.0.1"
        assert info["gcs"].startswith("127.0.0.1:")
        if engine:
            assert info["tokens"] == 4
        public = [row for row in listening if not is_loopback(row[2])]
        assert not public, f"listening beyond loopback: {public}"
        names = {name for _, name, _, _ in listening}
        pids = {pid for pid, _, _, _ in listening}
        # the check saw the components it is about (not an empty or partial listing)
        for expected in ("gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"):
            assert expected in names, (expected, sorted(names))
        assert set(info["workers"]) <= pids, "a worker's gRPC server was not seen"
        assert driver.pid in pids, "the driver's core worker was not seen"

        driver.stdin.write("done\n")
        driver.stdin.flush()
        assert _wait_for(lines, "STOPPED", STOP_TIMEOUT_S) is not None, stderr.read_text()[-4000:]
        assert driver.wait(timeout=STOP_TIMEOUT_S) == 0
    finally:
        if driver.poll() is None or seen:
            _kill_tree([p for p in [*seen, *_tree(driver.pid)] if p.is_running()])
        driver.wait(timeout=KILL_WAIT_S)
