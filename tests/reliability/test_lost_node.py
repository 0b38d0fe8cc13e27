"""A Ray node lost mid-step: a head on 127.0.0.2 and a second node on 127.0.0.3, 1 CPU each,
started here by `ray start` with their own --temp-dir and stopped by PID. `grpo_tiny_cpu` with a
separate rollout group needs two 1-CPU device groups, so one lands on each node. Once the
step-2 checkpoint is tracked, the second node's raylet is SIGKILLed: the run must end within a
bound made of the head's health-check settings, the driver's node poll (`POLL_S`) and its
bounded teardown, with one error naming the node and the role ranks it held. A resume from the
last checkpoint on a healthy (embedded) cluster then logs the same metrics as an uninterrupted
run of the same steps. A second test kills the node of a role that is idle while the other
node's call runs: the wait names the loss from Ray's verdict (polled once per `POLL_S`).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from mindrl.cluster.calls import POLL_S
from mindrl.cluster.processes import node_processes, stop_node
from tests.e2e._run import comparable, read_metrics, run_train, train_cmd
from tests.fresh_process import REPO, free_port

pytestmark = pytest.mark.slow

HEAD_IP, SECOND_IP = "127.0.0.2", "127.0.0.3"  # Ray rewrites 127.0.0.1 to eth0's address
# the head's GCS declares a node dead after THRESHOLD failed checks PERIOD apart, each bounded
HEALTH_PERIOD_MS, HEALTH_THRESHOLD, HEALTH_TIMEOUT_MS = 1000, 3, 1000
DETECTION_S = (HEALTH_PERIOD_MS * HEALTH_THRESHOLD + HEALTH_TIMEOUT_MS) / 1000
# the driver's teardown once the error is raised: each of the 3 groups' bounded shutdown
# (`WorkerGroup.shutdown`, 10 s) and the placement groups' release (`remove_placement_groups`,
# 10 s), then leaving Ray and the interpreter on a busy 2-core box
TEARDOWN_S = 3 * 10.0 + 10.0 + 30.0
LOST_BOUND_S = DETECTION_S + POLL_S + TEARDOWN_S
WORKER_TIMEOUT_S = 600.0  # a run that only ended by a call's timeout would overrun the bound
START_S = 240.0  # a node's start-up on a busy box
RUN_START_S = 600.0  # for the run to start and track its step-2 checkpoint
COMMON = (
    "rl_config.rollout_resource.num_npus=1",
    "actor_config.save_interval=2",
    "runtime.worker_threads=1",  # the same threads on two nodes and on one: the same numbers
)


# every process of the two-node cluster (nodes, driver) shares this run's own token
TOKEN = secrets.token_hex(32)


def _env(**extra: str) -> dict[str, str]:
    drop = ("RAY_ADDRESS", "RAY_TMPDIR", "RAY_AUTH_TOKEN_PATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONUNBUFFERED="1", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN, **extra)
    return env


def _ray_start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *args]
    cmd += ["--disable-usage-stats", "--object-store-memory", "300000000", "--num-cpus", "1"]
    cmd += ["--dashboard-agent-listen-port", str(free_port())]
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )


class TwoNodes:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.head_dir, self.second_dir = root / "h", root / "w"
        self.address = f"{HEAD_IP}:{free_port()}"
        self.procs: list[tuple[Path, subprocess.Popen]] = []

    def start(self) -> None:
        health = {
            "RAY_health_check_period_ms": str(HEALTH_PERIOD_MS),
            "RAY_health_check_failure_threshold": str(HEALTH_THRESHOLD),
            "RAY_health_check_timeout_ms": str(HEALTH_TIMEOUT_MS),
        }
        head = _ray_start(
            [
                "--head",
                "--port",
                self.address.rpartition(":")[2],
                "--node-ip-address",
                HEAD_IP,
                "--temp-dir",
                str(self.head_dir),
                "--include-dashboard",
                "false",
                "--ray-client-server-port",
                str(free_port()),
            ],
            self.root / "head.log",
            _env(**health),
        )
        self.procs.append((self.head_dir, head))
        self._wait_nodes(1, head)
        second = _ray_start(
            ["--address", self.address, "--node-ip-address", SECOND_IP]
            + ["--temp-dir", str(self.second_dir)],
            self.root / "second.log",
            _env(),
        )
        self.procs.append((self.second_dir, second))
        self._wait_nodes(2, head)

    def _wait_nodes(self, n: int, head: subprocess.Popen) -> None:
        cmd = [sys.executable, "-m", "mindrl.cluster.launch", "wait-nodes"]
        cmd += ["--address", self.address, "--nodes", str(n), "--timeout", str(START_S)]
        proc = subprocess.run(
            [*cmd, "--pid", str(head.pid)],
            env=_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=2 * START_S + 60,
        )
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in self.root.glob("*.log"))
        assert proc.returncode == 0, proc.stdout + proc.stderr + logs

    def second_raylet(self) -> psutil.Process:
        raylets = [
            p
            for p in node_processes(str(self.second_dir))
            if os.path.basename((p.cmdline() or [""])[0]) == "raylet"
        ]
        assert len(raylets) == 1, raylets
        return raylets[0]

    def stop(self) -> list[int]:
        for temp_dir, proc in reversed(self.procs):
            stop_node(str(temp_dir), [proc.pid], 15.0)
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        return [p.pid for temp_dir, _ in self.procs for p in node_processes(str(temp_dir))]


@pytest.fixture
def two_nodes() -> Iterator[TwoNodes]:
    root = Path(tempfile.mkdtemp(prefix="mrln", dir="/tmp"))  # short: Ray's unix sockets
    nodes = TwoNodes(root)
    try:
        nodes.start()
        yield nodes
    finally:
        left = nodes.stop()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray processes left: {left}"


def _tracked(out: Path) -> int:
    tracker = out / "ckpt" / "latest_checkpointed_iteration.txt"
    text = tracker.read_text().strip() if tracker.is_file() else ""
    return int(text) if text.isdigit() else 0


def _roles_on(log: str, ip: str) -> tuple[set[str], str]:
    """The role ranks the driver's placement report put on `ip`, and that node's id prefix."""
    held, node = set(), ""
    for group, where in re.findall(r"^\s+(\S+): (bundle 0 -> .*)$", log, re.M):
        for bundle, bundle_ip, prefix in re.findall(r"bundle (\d+) -> (\S+) \((\w+)\)", where):
            if bundle_ip == ip:
                node = prefix
                held |= {f"{role} rank {bundle}" for role in group.split("+")}
    return held, node


def test_a_lost_node_ends_the_run_named_and_a_resume_continues_exactly(two_nodes, tmp_path):
    out = tmp_path / "lost"
    log = tmp_path / "lost.log"
    cmd = train_cmd(
        out,
        *COMMON,
        "actor_config.train_iters=8",
        f"runtime.ray_address={two_nodes.address}",
        f"runtime.worker_timeout_s={WORKER_TIMEOUT_S:g}",
    )
    with open(log, "w") as fh:
        driver = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=_env(), start_new_session=True
        )
    try:
        deadline = time.monotonic() + RUN_START_S
        while _tracked(out) < 2 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert driver.poll() is None and _tracked(out) >= 2, log.read_text()[-4000:]
        held, node_prefix = _roles_on(log.read_text(), SECOND_IP)
        assert held and node_prefix, log.read_text()[-4000:]

        two_nodes.second_raylet().send_signal(signal.SIGKILL)
        killed = time.monotonic()
        rc = driver.wait(timeout=LOST_BOUND_S)
        took = time.monotonic() - killed
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    text = log.read_text()
    print(f"\nlost node: the run ended {took:.1f} s after the raylet's SIGKILL")
    assert rc == 1, text[-4000:]
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-4000:]
    assert f"error: lost Ray node {SECOND_IP} (node id {node_prefix}" in errors[0], errors
    named = set(re.search(r"it held (.*?);", errors[0]).group(1).split(", "))  # type: ignore[union-attr]
    assert named == held, errors
    assert "did not finish within" not in text
    last = _tracked(out)
    assert last >= 2 and last % 2 == 0

    # a resume on a healthy cluster from the last checkpoint, against an uninterrupted run
    left = two_nodes.stop()
    assert not left, left
    steps = last + 2
    embedded = (
        "runtime.ray_address=local",
        "runtime.ray_num_cpus=2",
        f"actor_config.train_iters={steps}",
    )
    resumed = tmp_path / "resumed"
    proc = run_train(resumed, *COMMON, *embedded, f"actor_config.load={out / 'ckpt'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from" in proc.stderr + proc.stdout
    straight = tmp_path / "straight"
    proc = run_train(straight, *COMMON, *embedded)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = read_metrics(resumed)
    assert [m["step"] for m in again] == [last + 1, last + 2]
    assert [comparable(m) for m in again] == [comparable(m) for m in read_metrics(straight)[last:]]


# A driver whose only call in flight runs on the head while the other node dies: the loss is
# noticed from Ray's verdict (polled by the wait), not from a failed call.
IDLE_ROLE_DRIVER = """
import sys, time
import ray
from ray.util.placement_group import placement_group, placement_group_table
from mindrl.cluster.errors import NodeLost
from mindrl.cluster.worker import Worker
from mindrl.cluster.worker_group import WorkerGroup

class Sleeper(Worker):
    def sleep(self, seconds):
        time.sleep(seconds)

ray.init(address=sys.argv[1])
ip_of = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
pgs = [placement_group([{"CPU": 1}], strategy="STRICT_PACK") for _ in range(2)]
assert all(pg.wait(120) for pg in pgs)
on = {ip_of[placement_group_table(pg)["bundles_to_node_id"][0]]: pg for pg in pgs}
idle = WorkerGroup(Sleeper, "rollout", on[sys.argv[2]], [0], master_addr="127.0.0.1")
busy = WorkerGroup(Sleeper, "actor", on[sys.argv[3]], [0], master_addr="127.0.0.1", timeout_s=600)
print("ready", flush=True)
try:
    busy.execute_all("sleep", 300)
except NodeLost as exc:
    print(f"lost: {exc}", flush=True)
"""
SCHEDULING_SLACK_S = 5.0  # the driver and GCS getting a core on a busy 2-core box


def test_a_lost_node_holding_an_idle_role_is_noticed_by_the_wait(two_nodes, tmp_path):
    log = tmp_path / "driver.log"
    cmd = [sys.executable, "-c", IDLE_ROLE_DRIVER, two_nodes.address, SECOND_IP, HEAD_IP]
    with open(log, "w") as fh:
        driver = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=_env(), start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_S
        while "ready" not in log.read_text() and time.monotonic() < deadline:
            assert driver.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        assert "ready" in log.read_text(), log.read_text()[-3000:]
        two_nodes.second_raylet().send_signal(signal.SIGKILL)
        killed = time.monotonic()
        bound = DETECTION_S + POLL_S + SCHEDULING_SLACK_S
        while "lost: " not in log.read_text() and time.monotonic() - killed < bound:
            time.sleep(0.1)
        took = time.monotonic() - killed
        text = log.read_text()
        lost = [line for line in text.splitlines() if line.startswith("lost: ")]
        assert lost, f"not named within {bound:g} s:\n{text[-3000:]}"
        assert f"lost Ray node {SECOND_IP} (node id " in lost[0], lost
        assert "during sleep(): it held rollout rank 0; " in lost[0], lost
        assert "refuses connections" not in lost[0]  # Ray's verdict, no call had failed
        print(f"\nidle role's node: named {took:.1f} s after the raylet's SIGKILL")
        assert driver.wait(timeout=60) == 0, text[-3000:]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
