"""The doctor on two Ray nodes of one machine (a head on 127.0.0.2, a node on 127.0.0.3, as in
test_lost_node.py, stopped by PID): a save folder both nodes see passes and the collectives run
across the nodes; a folder each node resolves elsewhere (a per-node `$NODE_SCRATCH`, as a
node-local disk would be) is a fail that names both paths and the fix."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fresh_process import REPO, free_port, run_process
from tests.reliability.test_lost_node import HEAD_IP, SECOND_IP, TwoNodes, _env, _ray_start

pytestmark = pytest.mark.slow

DOCTOR_S = 600.0


class ScratchPerNode(TwoNodes):
    """Two nodes whose processes see a different `NODE_SCRATCH` each."""

    def start(self) -> None:
        self.scratch = {
            HEAD_IP: self.root / "scratch-head",
            SECOND_IP: self.root / "scratch-second",
        }
        port = self.address.rpartition(":")[2]
        head_args = ["--head", "--port", port, "--node-ip-address", HEAD_IP]
        head_args += ["--temp-dir", str(self.head_dir), "--include-dashboard", "false"]
        head_args += ["--ray-client-server-port", str(free_port())]
        head = _ray_start(
            head_args, self.root / "head.log", _env(NODE_SCRATCH=str(self.scratch[HEAD_IP]))
        )
        self.procs.append((self.head_dir, head))
        self._wait_nodes(1, head)
        second_args = ["--address", self.address, "--node-ip-address", SECOND_IP]
        second_args += ["--temp-dir", str(self.second_dir)]
        env = _env(NODE_SCRATCH=str(self.scratch[SECOND_IP]))
        second = _ray_start(second_args, self.root / "second.log", env)
        self.procs.append((self.second_dir, second))
        self._wait_nodes(2, head)


@pytest.fixture
def scratch_nodes() -> Iterator[ScratchPerNode]:
    root = Path(tempfile.mkdtemp(prefix="mrdn", dir="/tmp"))  # short: Ray's unix sockets
    nodes = ScratchPerNode(root)
    try:
        nodes.start()
        yield nodes
    finally:
        left = nodes.stop()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray processes left: {left}"


def _doctor(nodes: ScratchPerNode, save_dir: str, out: Path, *checks: str) -> tuple[int, dict, str]:
    cmd = [sys.executable, str(REPO / "cli" / "doctor.py"), "--only", *checks]
    cmd += ["--save-dir", save_dir, "--json", str(out)]
    proc = run_process(cmd, timeout_s=DOCTOR_S, env=_env(RAY_ADDRESS=nodes.address))
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text()), proc.stdout


def test_save_folder_shared_and_unshared_across_two_nodes(scratch_nodes, tmp_path):
    rc, report, stdout = _doctor(
        scratch_nodes,
        str(tmp_path / "shared"),
        tmp_path / "a.json",
        "ray",
        "save_folder",
        "collectives",
    )
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 0 and all(c["status"] == "pass" for c in checks.values()), stdout
    assert len(checks["ray"]["details"]["nodes"]) == 2
    assert {r["node"] for r in checks["save_folder"]["details"]["read"]} == {HEAD_IP, SECOND_IP}
    across = checks["collectives"]["details"]["across nodes"]
    assert len(across) == 2 and all(r["all_reduce_ok"] and r["all_gather_ok"] for r in across)

    rc, report, stdout = _doctor(
        scratch_nodes, "$NODE_SCRATCH/ckpt", tmp_path / "b.json", "save_folder"
    )
    (check,) = report["checks"]
    assert rc == 1 and check["status"] == "fail", stdout
    writer = check["details"]["written"]["node"]  # the driver's node
    other = SECOND_IP if writer == HEAD_IP else HEAD_IP
    written = Path(check["details"]["written"]["path"])
    assert written.is_relative_to(scratch_nodes.scratch[writer])
    (unseen,) = [r for r in check["details"]["read"] if not r["ok"]]
    assert unseen["node"] == other
    assert unseen["path"].startswith(str(scratch_nodes.scratch[other]))
    assert "storage every node mounts at the same path" in check["fix"]
    assert "[FAIL] save_folder" in stdout
