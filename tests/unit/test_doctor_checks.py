"""The doctor's host checks and its report: a missing package and broken environment
variables are fails that say what to do; a clean setting passes. The checks that start Ray
and processes are tests/integration/test_doctor_cli.py."""

from __future__ import annotations

import json

import pytest

from mindrl.accelerator import Accelerator
from mindrl.accelerator.versions import MATRIX, Requirement
from mindrl.doctor.host_checks import environment_check, versions_check
from mindrl.doctor.report import CheckResult, DoctorReport, machine_description
from mindrl.doctor.runner import ALL_CHECKS, SLOW_CHECKS, selected_checks

CPU, CUDA = Accelerator("cpu"), Accelerator("cuda")
MISSING = "mindrl-doctor-no-such-package"


def test_versions_pass_on_this_box() -> None:
    result = versions_check(CPU, need_vllm=False)
    assert result.status == "pass", result
    assert result.details["installed"]["torch"]


def test_a_missing_package_is_a_fail_with_the_fix() -> None:
    rows = (*MATRIX["cpu"], Requirement(MISSING, ">=1.0", "the doctor's test row"))
    result = versions_check(CPU, need_vllm=False, requirements=rows)
    assert result.status == "fail"
    assert MISSING in result.summary and "pip install" in result.fix


def test_a_package_below_its_range_is_a_fail() -> None:
    rows = (Requirement("torch", ">=99", "a future torch"),)
    result = versions_check(CPU, need_vllm=False, requirements=rows)
    assert result.status == "fail" and "below the supported range >=99" in result.summary


def test_clean_environment_passes() -> None:
    result = environment_check(CPU, devices_wanted=2, env={}, interfaces=["lo"])
    assert result.status == "pass", result


@pytest.mark.parametrize("value", ["0,,1", "x", " ", "0;1"])
def test_malformed_visible_devices_is_a_fail_on_cpu(value: str) -> None:
    env = {"CUDA_VISIBLE_DEVICES": value}
    result = environment_check(CPU, devices_wanted=1, env=env, interfaces=["lo"])
    assert result.status == "fail"
    assert "CUDA_VISIBLE_DEVICES" in result.summary and "unset it" in result.fix


def test_well_formed_visible_devices_only_warns_on_cpu() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    result = environment_check(CPU, devices_wanted=1, env=env, interfaces=["lo"])
    assert result.status == "warn" and "no effect" in result.fix


def test_visible_devices_pointing_at_no_device_is_a_fail_on_gpu() -> None:
    # what torch reports when CUDA_VISIBLE_DEVICES names devices the node does not have
    env = {"CUDA_VISIBLE_DEVICES": "6,7"}
    result = environment_check(CUDA, devices_wanted=2, env=env, devices_seen=0, interfaces=["lo"])
    assert result.status == "fail"
    assert "0 device(s) visible with CUDA_VISIBLE_DEVICES='6,7'" in result.summary
    assert "nvidia-smi" in result.fix


def test_a_device_listed_twice_is_a_fail() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "1,1"}
    result = environment_check(CUDA, devices_wanted=1, env=env, devices_seen=1, interfaces=["lo"])
    assert result.status == "fail" and "twice" in result.summary


def test_socket_interface_that_does_not_exist_is_a_fail() -> None:
    env = {"GLOO_SOCKET_IFNAME": "ib7"}
    result = environment_check(CPU, devices_wanted=1, env=env, interfaces=["lo", "eth0"])
    assert result.status == "fail" and "no interface ib7" in result.summary
    prefix = environment_check(
        CPU, devices_wanted=1, env={"NCCL_SOCKET_IFNAME": "eth"}, interfaces=["eth0"]
    )
    assert prefix.status == "pass"  # NCCL matches interface-name prefixes


def test_omp_threads() -> None:
    bad = environment_check(CPU, devices_wanted=1, env={"OMP_NUM_THREADS": "two"}, interfaces=[])
    assert bad.status == "fail"
    many = environment_check(
        CPU, devices_wanted=1, env={"OMP_NUM_THREADS": "100000"}, interfaces=[]
    )
    assert many.status == "warn" and "oversubscribe" in many.fix


def test_report_status_console_and_json(tmp_path) -> None:
    report = DoctorReport(machine_description(), "cpu", "defaults")
    report.results.append(CheckResult("versions", "pass", "ok"))
    assert report.status == "pass"
    report.results.append(CheckResult("environment", "warn", "hm", "do this"))
    assert report.status == "warn"
    report.results.append(CheckResult("ray", "fail", "down", "start it"))
    lines = report.console_lines()
    assert lines[0].startswith(f"mindrl doctor on {report.machine['host']}")
    assert "       fix: start it" in lines and lines[-1].startswith(
        "doctor: fail (1 pass, 1 warn, 1 fail)"
    )
    report.write_json(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["status"] == "fail" and [c["name"] for c in data["checks"]] == [
        "versions",
        "environment",
        "ray",
    ]


def test_check_selection() -> None:
    assert selected_checks() == ALL_CHECKS
    assert not set(SLOW_CHECKS) & set(selected_checks(quick=True))
    assert selected_checks(only=["engine", "ray"]) == ("ray", "engine")
    with pytest.raises(ValueError, match="unknown check"):
        selected_checks(only=["nope"])


def test_settings_from_a_config() -> None:
    from mindrl.config import load_run_config
    from mindrl.doctor.settings import settings_from_config

    run, _ = load_run_config(
        "grpo_tiny_cpu",
        ["actor_config.tensor_model_parallel_size=2", "rl_config.actor_resource.num_npus=2"],
        local_paths=False,
    )
    settings = settings_from_config(run, CPU)
    assert settings.tp == 2 and str(settings.save_dir) == run.actor.ckpt.save
    assert settings.host_bytes and settings.host_bytes > 0 and settings.device_bytes is None


def test_the_dry_runs_doctor_flag_needs_the_dry_run() -> None:
    from mindrl.trainer.entry import parse_args

    args, _ = parse_args(["--config-name", "grpo_tiny_cpu", "--dry-run", "--doctor"])
    assert args.doctor and args.dry_run
    with pytest.raises(SystemExit):
        parse_args(["--config-name", "grpo_tiny_cpu", "--doctor"])
