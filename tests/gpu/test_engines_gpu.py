"""The rollout engines on one CUDA device through the doctor's engine probe (the calls a run
makes: start, greedy generate, a reload of every weight, sleep and wake): the HF engine
always, vLLM where its CUDA build is installed. CPU twins: tests/integration's
test_rollout_vllm.py and test_vllm_host_sleep.py; the whole doctor on the GPU box too."""

from __future__ import annotations

import json
import sys

import pytest

from mindrl.doctor.engine_probe import run_engine_probe
from mindrl.doctor.runner import ALL_CHECKS
from mindrl.rollout import vllm_usable
from tests.fresh_process import REPO, run_process


def _assert_probe(out: dict) -> None:
    assert out["tokens"] and all(out["tokens"]), out
    assert out["same_after_reload"], out
    assert out["same_after_wake"] in (True, None), out


def test_hf_engine_generate_reload_sleep_wake() -> None:
    _assert_probe(run_engine_probe("cuda", "hf", 0.3))


@pytest.mark.skipif(not vllm_usable("cuda")[0], reason="needs vLLM's CUDA build")
def test_vllm_engine_generate_reload_sleep_wake() -> None:
    out = run_engine_probe("cuda", "vllm", 0.3)
    _assert_probe(out)
    assert out["sleep_wake"] and out["same_after_wake"], out  # CUDA has vLLM's sleep mode


def test_doctor_on_the_gpu_box(tmp_path) -> None:
    report_file = tmp_path / "report.json"
    cmd = [sys.executable, str(REPO / "cli" / "doctor.py"), "--json", str(report_file)]
    proc = run_process([*cmd, "--save-dir", str(tmp_path)], timeout_s=900.0)
    report = json.loads(report_file.read_text())
    assert report["accelerator"] == "cuda", proc.stdout
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert set(statuses) == set(ALL_CHECKS)
    assert "fail" not in statuses.values(), proc.stdout  # one GPU: collectives may be a skip
