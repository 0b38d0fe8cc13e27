"""The multi-node launch scripts on one machine: a head and a second Ray node, GRPO across both.

`examples/launch/master.sh` starts the head on 127.0.0.2 and `examples/launch/worker.sh` a
second node on 127.0.0.3 (Ray turns 127.0.0.1 into the machine's eth0 address, other loopback
addresses it keeps), each with its own `--temp-dir` and 1 CPU. `grpo_tiny_cpu` with a separate
rollout group needs two 1-CPU device groups, so one must land on each node. Every process the
scripts start is recorded while they run and must be gone afterwards. Every wait is bounded.

The first tests check, without Ray, that `python -m mindrl.cluster.launch stop` ends exactly the
processes of its own node and nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from mindrl.cluster import launch
from tests.bounds import call_within

ROOT = Path(__file__).resolve().parents[2]
MASTER = ROOT / "examples" / "launch" / "master.sh"
WORKER = ROOT / "examples" / "launch" / "worker.sh"
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
RUN_BUDGET_S = 900.0  # the whole two-node run, Ray start-ups included, on a busy 2-core box


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _ray_dir(prefix: str) -> str:
    """A short dedicated folder: Ray's unix sockets live under it (path length limit ~107)."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CONFIG")}
    env.update(
        PYTHON=sys.executable,
        DEVICE_TYPE="cpu",
        NUM_DEVICES="1",
        STOP_GRACE="10",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class Script:
    """A launch script in its own session; its output is kept line by line with arrival times."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path):
        self.log = log
        self.lines: list[tuple[float, str]] = []
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "w", encoding="utf-8") as fh:
            for line in self.proc.stdout:
                self.lines.append((time.monotonic(), line))
                fh.write(line)
                fh.flush()

    @property
    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def tail(self, n: int = 40) -> str:
        return "".join(line for _, line in self.lines[-n:])

    def wait_for(self, needle: str, timeout_s: float, recorder: Recorder | None = None) -> float:
        """The arrival time of the first line containing `needle` (fails on exit or timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if needle in line:
                    return t
            if self.proc.poll() is not None:
                self._pump.join(timeout=5)
                if any(needle in line for _, line in self.lines):
                    continue
                raise AssertionError(
                    f"exited ({self.proc.returncode}) before {needle!r}:\n{self.tail()}"
                )
            if recorder is not None:
                recorder.snap()
            time.sleep(0.3)
        raise AssertionError(f"no {needle!r} within {timeout_s:g} s:\n{self.tail()}")

    def finish(self, timeout_s: float) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        self._pump.join(timeout=10)
        return rc

    def stop(self) -> None:
        """SIGTERM (the script's trap stops its Ray processes), then SIGKILL its session."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


class Recorder:
    """Every process under the given roots, seen while they ran: (pid, start time) -> command."""

    def __init__(self, *roots: Script):
        self.roots = list(roots)
        self.seen: dict[tuple[int, float], str] = {}

    def add(self, script: Script) -> None:
        self.roots.append(script)

    def snap(self) -> None:
        for script in self.roots:
            try:
                top = psutil.Process(script.proc.pid)
                procs = [top, *top.children(recursive=True)]
            except psutil.Error:
                continue
            for p in procs:
                try:
                    key = (p.pid, p.create_time())
                    if key not in self.seen:
                        self.seen[key] = " ".join(p.cmdline())[:200] or p.name()
                except psutil.Error:
                    pass

    def alive(self) -> list[str]:
        out = []
        for (pid, created), cmd in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{pid} {cmd}")
            except psutil.Error:
                pass
        return out

    def kill_leftovers(self) -> None:
        for (pid, created), _ in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:
                    p.kill()
            except psutil.Error:
                pass


def _processes_naming(folder: str) -> list[str]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if folder in cmd:
            out.append(f"{p.pid} {cmd[:200]}")
    return out


def _recorded_pids(folder: str) -> list[tuple[int, float]]:
    path = Path(folder) / "stopped_pids.txt"
    rows = [line.split()[:2] for line in path.read_text().splitlines() if line.strip()]
    return [(int(pid), float(created)) for pid, created in rows]


def _still_running(pid: int, created: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# -- stop: exactly the node's processes, without Ray ------------------------------------------------

SLEEP = "import time; time.sleep(120)"


def _sleeper(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLEEP, *args], start_new_session=True)


def _wait_children(pid: int, n: int, timeout_s: float = 20.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kids = psutil.Process(pid).children(recursive=True)
        if len(kids) >= n:
            return kids
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} has fewer than {n} children after {timeout_s:g} s")


def test_stop_ends_the_tree_and_the_temp_dir_processes_only(tmp_path, capsys):
    mine, other = tmp_path / "node", tmp_path / "node2"  # "node" is a prefix of "node2"
    # a root with a child tree (as `ray start --block` and its raylet), a process of the same
    # node that is not in the tree (found by its session dir), and another node's process
    root = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -c '{SLEEP}' & {sys.executable} -c '{SLEEP}' & wait"],
        start_new_session=True,
    )
    loose = _sleeper(f"--session_dir={mine}/session_2026_1")
    foreign = _sleeper(f"--session_dir={other}/session_2026_1", f"--temp-dir={other}")
    unrelated = _sleeper()
    try:
        tree = [psutil.Process(root.pid), *_wait_children(root.pid, 2)]
        found = {p.pid for p in launch.node_processes(str(mine), [root.pid])}
        assert found == {p.pid for p in tree} | {loose.pid}
        record = tmp_path / "stopped.txt"
        assert launch.stop_node(str(mine), [root.pid], grace_s=5.0, record=str(record)) == 0
        # all of them ended on SIGTERM: none needed the SIGKILL after the grace
        said = capsys.readouterr().out
        assert f"stopped {len(found)} process(es)\n" in said, said
        for p in tree:
            assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE, p
        assert loose.wait(timeout=5) == -signal.SIGTERM and root.wait(timeout=5) is not None
        assert foreign.poll() is None and unrelated.poll() is None  # not ours: untouched
        assert {int(line.split()[0]) for line in record.read_text().splitlines()} == found
    finally:
        for proc in (root, loose, foreign, unrelated):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def test_stop_kills_what_ignores_sigterm(tmp_path, capsys):
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(120)"
    )
    stubborn = subprocess.Popen(
        [sys.executable, "-c", code, f"--temp-dir={tmp_path}"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stubborn.stdout.readline() == "ready\n"  # its handler is installed
        assert launch.stop_node(str(tmp_path), [stubborn.pid], grace_s=1.0) == 0
        assert stubborn.wait(timeout=5) == -signal.SIGKILL
        assert "stopped 1 process(es), 1 with SIGKILL" in capsys.readouterr().out
    finally:
        stubborn.stdout.close()
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait(timeout=10)


def test_wait_nodes_gives_up_when_no_head_answers(capsys):
    address = f"{HEAD_IP}:{_free_port()}"
    head_timeout_s, nodes_timeout_s = 2.0, 5.0
    code = call_within(  # a hang guard: ten times both of its clocks
        lambda: launch.wait_nodes(
            address, nodes=2, timeout_s=nodes_timeout_s, head_timeout_s=head_timeout_s
        ),
        10 * (head_timeout_s + nodes_timeout_s),
    )
    assert code == 1
    out = capsys.readouterr().out
    # the head's clock ended the wait; the nodes' clock never started
    assert f"the Ray head at {address} is not up after 2 s" in out
    assert "waiting up to" not in out


def test_detect_devices_counts_what_it_is_asked_for(monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1,2,5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    assert launch.detect_devices("npu") == ("npu", 4)
    assert launch.detect_devices("gpu") == ("gpu", 2)
    assert launch.detect_devices("cpu") == ("cpu", len(os.sched_getaffinity(0)))


# -- the scripts on a real two-node Ray cluster -----------------------------------------------


@pytest.mark.slow
def test_master_and_worker_scripts_run_grpo_across_two_nodes(tmp_path, tiny_model_dir):
    head_dir, worker_dir = _ray_dir("mrlh"), _ray_dir("mrlw")
    port = _free_port()
    out = tmp_path / "run"
    address = f"{HEAD_IP}:{port}"
    common = {"MASTER_ADDR": HEAD_IP, "MASTER_PORT": str(port), "JOIN_TIMEOUT": "300"}
    master_env = _env(
        **common,
        NNODES="2",
        DASHBOARD_PORT=str(_free_port()),
        RAY_START_ARGS=(
            f"--object-store-memory 300000000 --ray-client-server-port {_free_port()} "
            f"--dashboard-agent-listen-port {_free_port()}"
        ),
    )
    worker_env = _env(
        **common,
        NODE_IP_ADDRESS=WORKER_IP,
        HEAD_LOST_TIMEOUT="5",
        RAY_START_ARGS=(
            f"--object-store-memory 300000000 --dashboard-agent-listen-port {_free_port()}"
        ),
    )
    start = time.monotonic()
    master = Script(
        [
            "bash",
            str(MASTER),
            "--temp-dir",
            head_dir,
            "--include-dashboard=false",
            "grpo_tiny_cpu",
            "rl_config.rollout_resource.num_npus=1",
            "actor_config.train_iters=2",
            f"runtime.output_dir={out}",
            f"actor_config.save={out}/ckpt",
        ],
        master_env,
        tmp_path / "master.log",
    )
    recorder = Recorder(master)
    scripts = [master]
    placement: subprocess.Popen | None = None
    try:
        # the worker starts once the head has its auth token, as an operator would
        master.wait_for("starting the Ray head", 120, recorder)
        worker = Script(
            ["bash", str(WORKER), "--temp-dir", worker_dir], worker_env, tmp_path / "worker.log"
        )
        scripts.append(worker)
        recorder.add(worker)
        worker.wait_for("joined", 300, recorder)
        t_joined = master.wait_for("2 of 2 node(s) alive", 300, recorder)

        # where the run's placement groups land, asked from a separate driver process
        placement = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mindrl.cluster.launch",
                "placement",
                "--address",
                address,
                "--groups",
                "2",
                "--timeout",
                "400",
            ],
            cwd=ROOT,
            env={**master_env, "RAY_AUTH_MODE": "token"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        while master.proc.poll() is None:
            assert time.monotonic() - start < RUN_BUDGET_S, master.tail()
            recorder.snap()
            time.sleep(0.5)
        rc = master.finish(30)
        t_master_done = time.monotonic()
        assert rc == 0, master.tail(80)
        placed, _ = placement.communicate(timeout=120)
        worker_rc = worker.finish(120)  # leaves ~HEAD_LOST_TIMEOUT s after the head is gone
        t_worker_done = time.monotonic()
    finally:
        for s in scripts:
            s.stop()
        if placement is not None and placement.poll() is None:
            placement.kill()
            placement.wait(timeout=10)
        leftovers = recorder.alive()
        recorder.kill_leftovers()

    print(
        f"\ntimings: nodes joined {t_joined - start:.0f} s, master done "
        f"{t_master_done - start:.0f} s, worker done {t_worker_done - start:.0f} s; "
        f"{len(recorder.seen)} processes recorded"
    )
    assert worker_rc == 0, worker.tail()

    # the run: 2 GRPO steps through the cluster the scripts made
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert f"runtime.ray_address={address}" in master.text

    # one device group per node: both nodes host a group, and they are different nodes
    report = json.loads(next(line for line in placed.splitlines() if line.startswith("{")))
    groups = {g["name"].split(":")[1]: g for g in report["groups"]}
    assert set(groups) == {"actor+ref", "rollout"}, placed
    node_of = {name: {b["node_ip"] for b in g["bundles"]} for name, g in groups.items()}
    assert {ip for ips in node_of.values() for ip in ips} == {HEAD_IP, WORKER_IP}, node_of
    assert len({b["node_id"] for g in groups.values() for b in g["bundles"]}) == 2
    # the driver saw its workers' output arrive from the second node
    assert f"ip={WORKER_IP}" in master.text

    # nothing the scripts started is left: what the test saw, and what the scripts stopped
    assert not leftovers, leftovers
    assert not _processes_naming(head_dir) and not _processes_naming(worker_dir)
    for folder in (head_dir, worker_dir):
        stopped = _recorded_pids(folder)
        assert stopped, folder
        assert not [p for p in stopped if _still_running(*p)], stopped
    for folder in (head_dir, worker_dir):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_master_gives_up_when_a_worker_never_joins(tmp_path):
    head_dir = _ray_dir("mrlh")
    env = _env(
        MASTER_ADDR=HEAD_IP,
        MASTER_PORT=str(_free_port()),
        NNODES="2",
        JOIN_TIMEOUT="10",
        HEAD_START_TIMEOUT="180",
        DASHBOARD_PORT=str(_free_port()),
        RAY_START_ARGS=(
            f"--object-store-memory 100000000 --ray-client-server-port {_free_port()} "
            f"--dashboard-agent-listen-port {_free_port()}"
        ),
    )
    master = Script(
        ["bash", str(MASTER), "--temp-dir", head_dir, "grpo_tiny_cpu"], env, tmp_path / "m.log"
    )
    recorder = Recorder(master)
    # after the wait starts: JOIN_TIMEOUT, then the head's stop (STOP_GRACE); three times that
    give_up_s = 3 * (float(env["JOIN_TIMEOUT"]) + float(env["STOP_GRACE"]))
    try:
        t_wait = master.wait_for("waiting up to 10 s for 2 node(s)", 240, recorder)
        while master.proc.poll() is None and time.monotonic() - t_wait < give_up_s:
            recorder.snap()
            time.sleep(0.3)
        rc = master.finish(30)
    finally:
        master.stop()
        leftovers = recorder.alive()
        recorder.kill_leftovers()

    assert rc != 0
    assert "only 1 of 2 nodes joined after 10 s" in master.text, master.tail()
    assert "cli/train_grpo.py" not in master.text  # the driver never started
    assert not leftovers, leftovers
    assert not _processes_naming(head_dir)
    stopped = _recorded_pids(head_dir)
    assert any("ray.scripts.scripts start --head" in cmd for cmd in recorder.seen.values())
    assert stopped and not [p for p in stopped if _still_running(*p)], stopped
    shutil.rmtree(head_dir, ignore_errors=True)
