"""Joining a running Ray cluster the MindSpeed-RL way: `ray start --head ...` on the machine,
then `python cli/train_grpo.py --config-name X` with no address.

A real head is started here on 127.0.0.1 with its own --temp-dir and ports, and stopped by
PID. It records itself where a plain `ray.init()` looks for "the current cluster" only for the
processes this test gives `RAY_TMPDIR` (Ray 2.60 reads `$RAY_TMPDIR/ray/ray_current_cluster`;
`ray start --temp-dir $RAY_TMPDIR/ray` writes it there), so no other process on the machine
can find it. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mindrl.cluster.launch import port_open
from mindrl.cluster.processes import node_processes, stop_node
from mindrl.cluster.ray_target import RayTarget, ray_current_cluster_file, resolve_ray_target
from mindrl.config.run import RuntimeConfig
from tests.fresh_process import REPO, ProcessRun, free_port, run_process

HEAD_START_S = 180.0  # a head's start-up on a busy 2-core box
DRY_RUN_S = 300.0
TRAIN_S = 900.0  # two GRPO steps of the tiny model, worker start-ups included
STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class Head:
    proc: subprocess.Popen
    ray_tmpdir: Path  # RAY_TMPDIR that makes this head "the current cluster"
    temp_dir: Path  # its --temp-dir: ray_tmpdir / "ray"
    address: str  # what it recorded in temp_dir / ray_current_cluster

    def alive(self) -> bool:
        host, _, port = self.address.rpartition(":")
        return self.proc.poll() is None and port_open(host, int(port), timeout_s=2.0)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")}
    env.update(extra)
    return env


def _wait_for_head(proc: subprocess.Popen, record: Path, log: Path) -> str:
    deadline = time.monotonic() + HEAD_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"ray start exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        address = record.read_text().strip() if record.is_file() else ""
        if address:
            host, _, port = address.rpartition(":")
            if port_open(host, int(port), timeout_s=2.0):
                return address
        time.sleep(0.5)
    pytest.fail(
        f"the Ray head did not come up within {HEAD_START_S:g} s:\n{log.read_text()[-3000:]}"
    )


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    # short: Ray's unix sockets live under it (path length limit ~107)
    ray_tmpdir = Path(tempfile.mkdtemp(prefix="mrlj", dir="/tmp"))
    temp_dir = ray_tmpdir / "ray"
    temp_dir.mkdir()
    log = ray_tmpdir / "head.log"
    cmd = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--block",
        "--port",
        str(free_port()),
        "--temp-dir",
        str(temp_dir),
        "--node-ip-address",
        "127.0.0.1",
        "--num-cpus",
        "2",
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
        "--object-store-memory",
        "300000000",
        "--ray-client-server-port",
        str(free_port()),
        "--dashboard-agent-listen-port",
        str(free_port()),
    ]
    # drain 0: `ray start --block` would otherwise wait up to 30 s on SIGTERM
    env = _env(RAY_TMPDIR=str(ray_tmpdir), RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )
    try:
        address = _wait_for_head(proc, temp_dir / "ray_current_cluster", log)
        yield Head(proc, ray_tmpdir, temp_dir, address)
    finally:
        stop_node(str(temp_dir), [proc.pid], STOP_GRACE_S)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_GRACE_S)
        left = [p.pid for p in node_processes(str(temp_dir))]
        shutil.rmtree(ray_tmpdir, ignore_errors=True)
        assert not left, f"head processes left: {left}"


def _cli(*args: str, env: dict[str, str], timeout_s: float = DRY_RUN_S) -> ProcessRun:
    cmd = [sys.executable, str(REPO / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_cpu"]
    proc = run_process([*cmd, *args], timeout_s=timeout_s, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def _sessions(temp_dir: Path) -> list[str]:
    return sorted(p.name for p in temp_dir.glob("session_2*"))


@pytest.mark.slow
def test_train_joins_the_cluster_ray_start_recorded(head, tmp_path):
    out = tmp_path / "run"
    sessions = _sessions(head.temp_dir)
    proc = _cli(
        "actor_config.train_iters=2",
        f"runtime.output_dir={out}",
        f"actor_config.save={out / 'ckpt'}",
        env=_env(RAY_TMPDIR=str(head.ray_tmpdir)),  # no RAY_ADDRESS, no runtime.ray_address
        timeout_s=TRAIN_S,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    record = head.temp_dir / "ray_current_cluster"
    joined = (
        f"cluster: joining the running Ray cluster at {head.address} (from {record}, written "
        "by `ray start`): 1 node(s): CPU 2"
    )
    assert joined in proc.stdout, proc.stdout[-3000:]
    assert f"ray: joining the running Ray cluster at {head.address}" in proc.stderr
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # no cluster of its own: no new Ray session, and the head is still up (only disconnected)
    assert _sessions(head.temp_dir) == sessions
    assert head.alive()


def test_ray_address_then_runtime_ray_address_win(head, tmp_path):
    # RAY_ADDRESS (what `ray job submit` sets), with no recorded cluster to fall back on
    proc = _cli("--dry-run", env=_env(RAY_ADDRESS=head.address, RAY_TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        f"cluster: the running Ray cluster at {head.address} (from RAY_ADDRESS): 1 node(s): CPU 2"
    ) in proc.stdout
    # runtime.ray_address beats RAY_ADDRESS (which points at nothing here)
    env = _env(RAY_ADDRESS=f"127.0.0.1:{free_port()}", RAY_TMPDIR=str(tmp_path))
    proc = _cli("--dry-run", f"runtime.ray_address={head.address}", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"at {head.address} (from runtime.ray_address)" in proc.stdout
    # and "local" (Ray's spelling) keeps the run on an embedded cluster, a cluster running or not
    env = _env(RAY_TMPDIR=str(head.ray_tmpdir))
    proc = _cli("--dry-run", "runtime.ray_address=local", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "cluster: an embedded single-node Ray cluster on this machine (runtime.ray_address: local)"
    ) in proc.stdout
    assert "Connecting to existing Ray cluster" not in proc.stderr


def test_an_address_that_does_not_answer_is_one_line(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    proc = _cli(f"runtime.output_dir={tmp_path / 'out'}", env=_env(RAY_ADDRESS=address))
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: cannot join the Ray cluster at {address} (from RAY_ADDRESS): nothing accepts "
        f"connections at {address}"
    ], proc.stderr[-3000:]
    assert not (tmp_path / "out").exists()


# -- the decision itself, without a cluster ------------------------------------------------------


def test_the_current_cluster_file_is_the_one_ray_reads(monkeypatch):
    from ray._common.utils import get_ray_address_file

    for env in ({"RAY_TMPDIR": "/x/y"}, {"TMPDIR": "/t"}, {"RAY_TMPDIR": "/a", "TMPDIR": "/b"}, {}):
        for name in ("RAY_TMPDIR", "TMPDIR"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert str(ray_current_cluster_file()) == get_ray_address_file(None), env


def _record(folder: Path, address: str) -> Path:
    path = folder / "ray" / "ray_current_cluster"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(address)
    return path


def test_what_is_joined_and_what_is_not(tmp_path):
    rt = RuntimeConfig()
    answers = {"10.0.0.5:6379": None}

    def probe(address: str) -> str | None:
        return answers.get(address, f"nothing accepts connections at {address}")

    def resolve(environ: dict[str, str], runtime: RuntimeConfig = rt) -> RayTarget:
        return resolve_ray_target(runtime, environ, probe=probe)

    empty = {"RAY_TMPDIR": str(tmp_path / "none")}
    assert resolve(empty).embedded
    assert resolve({**empty, "RAY_ADDRESS": "10.0.0.9:1"}) == RayTarget("10.0.0.9:1", "RAY_ADDRESS")
    assert resolve({**empty, "RAY_ADDRESS": "local"}).embedded
    assert resolve({**empty, "RAY_ADDRESS": ""}).embedded  # empty means unset, as in Ray
    # a recorded cluster that answers is joined
    live = tmp_path / "live"
    path = _record(live, "10.0.0.5:6379\n")
    target = resolve({"RAY_TMPDIR": str(live)})
    assert target.address == "10.0.0.5:6379" and str(path) in target.source
    # runtime.ray_address wins over both; "local" forces the embedded cluster
    explicit = RuntimeConfig(ray_address="10.0.0.7:6379")
    assert resolve({"RAY_TMPDIR": str(live), "RAY_ADDRESS": "x:1"}, explicit).address == (
        "10.0.0.7:6379"
    )
    assert resolve({"RAY_TMPDIR": str(live)}, RuntimeConfig(ray_address="local")).embedded
    # a file left by a cluster that died is not joined: embedded, with the reason
    stale = tmp_path / "stale"
    _record(stale, "10.0.0.6:6379")
    target = resolve({"RAY_TMPDIR": str(stale)})
    assert target.embedded and "nothing accepts connections at 10.0.0.6:6379" in target.note
    # another user's record (a shared /tmp/ray) is never joined unasked
    if os.getuid() == 0:
        os.chown(path, 65534, 65534)
        target = resolve({"RAY_TMPDIR": str(live)})
        assert target.embedded and "belongs to another user" in target.note


def test_a_stale_record_falls_back_to_embedded_with_a_warning(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    _record(tmp_path, address)
    proc = _cli("--dry-run", env=_env(RAY_TMPDIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cluster: an embedded single-node Ray cluster on this machine" in proc.stdout
    assert f"warning: not joining the Ray cluster at {address} recorded in " in proc.stderr
