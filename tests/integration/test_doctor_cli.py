"""`cli/doctor.py` on this box: the quick set and (slow) every check with a run config, each a
pass; a broken variable is a fail with the fix; the dry run's `--doctor` runs the quick set.
The unshared save folder across two Ray nodes is tests/reliability/test_doctor_two_nodes.py."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from mindrl.doctor.runner import ALL_CHECKS, SLOW_CHECKS
from tests.fresh_process import REPO, ProcessRun, run_process

TIMEOUT_S = 900.0


def _doctor(*args: str, env: dict[str, str] | None = None) -> ProcessRun:
    cmd = [sys.executable, str(REPO / "cli" / "doctor.py"), *args]
    return run_process(cmd, timeout_s=TIMEOUT_S, env=env)


def _report(path: Path, proc: ProcessRun) -> dict:
    assert path.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(path.read_text())


@pytest.mark.slow  # an embedded Ray and four worker processes: about a minute, more on a busy box
def test_quick_doctor_passes_every_check(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = _doctor("--quick", "--json", str(out), "--save-dir", str(tmp_path / "save"))
    report = _report(out, proc)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses == {n: "pass" for n in ALL_CHECKS if n not in SLOW_CHECKS}, proc.stdout
    assert proc.returncode == 0
    assert f"mindrl doctor on {socket.gethostname()}" in proc.stdout
    gloo = next(c for c in report["checks"] if c["name"] == "collectives")["details"]["one node"]
    assert len(gloo) == 2 and all(r["all_reduce_busbw_gbps"] > 0 for r in gloo)
    assert not (tmp_path / "save" / ".mindrl-doctor").exists()  # the marker is cleaned up


def test_malformed_visible_devices_fails_with_the_fix(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = _doctor(
        "--only", "environment", "--json", str(out), env={"CUDA_VISIBLE_DEVICES": "0,,x"}
    )
    assert proc.returncode == 1, proc.stderr
    (check,) = _report(out, proc)["checks"]
    assert check["status"] == "fail" and "CUDA_VISIBLE_DEVICES='0,,x'" in check["summary"]
    assert "[FAIL] environment" in proc.stdout and "fix: " in proc.stdout


@pytest.mark.slow
def test_full_doctor_with_a_config_passes(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    args = ("--config-name", "grpo_tiny_cpu", "--json", str(out), "--save-dir", str(tmp_path))
    proc = _doctor(*args)
    report = _report(out, proc)
    assert [(c["name"], c["status"]) for c in report["checks"]] == [
        (n, "pass") for n in ALL_CHECKS
    ], proc.stdout
    assert report["planned_from"] == "config grpo_tiny_cpu"
    checks = {c["name"]: c for c in report["checks"]}
    assert all("[" in w["where"] for w in checks["devices"]["details"]["workers"])  # bundles
    engine = checks["engine"]["details"]
    assert engine["same_after_reload"] and engine["same_after_wake"] and engine["backend"] == "vllm"
    assert {r["tp"] for r in checks["megatron"]["details"]["ranks"]} == {1}


@pytest.mark.slow
def test_dry_run_calls_the_doctor() -> None:
    cmd = [sys.executable, str(REPO / "cli" / "train_grpo.py"), "--config-name", "grpo_tiny_cpu"]
    proc = run_process([*cmd, "--dry-run", "--doctor"], timeout_s=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "dry run: config valid" in proc.stdout and "doctor: pass" in proc.stdout
    doctor = proc.stdout.split("mindrl doctor on")[1]
    assert "[PASS] save_folder" in doctor and "[PASS] collectives" in doctor
    assert "] megatron " not in doctor and "] engine " not in doctor  # --quick
