"""Checks that read this process's environment only: the version matrix and the environment
variables an RL run's processes inherit (visible devices, NCCL / HCCL / Gloo, OpenMP)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from mindrl.accelerator import Accelerator
from mindrl.accelerator.versions import Requirement, check_versions, installed_versions
from mindrl.doctor.report import CheckResult

_INDEX_LIST = re.compile(
    r"^\s*(\d+|[A-Za-z]+-[0-9A-Fa-f-]+|MIG-[\w/-]+)(\s*,\s*(\d+|[A-Za-z]+-[0-9A-Fa-f-]+|MIG-[\w/-]+))*\s*$"
)
VISIBLE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")
PREFIXES_SHOWN = ("NCCL_", "HCCL_", "GLOO_", "OMP_", "MINDRL_")


def versions_check(
    acc: Accelerator,
    *,
    need_vllm: bool,
    requirements: Sequence[Requirement] | None = None,
) -> CheckResult:
    """The installed stack against mindrl's version matrix (`requirements`: other rows)."""
    names = [r.component for r in requirements] if requirements is not None else []
    found = installed_versions(names)
    findings = check_versions(acc.name, found, need_vllm=need_vllm, requirements=requirements)
    shown = {k: v for k, v in found.items() if v}
    errors = [f.message for f in findings if f.level == "error"]
    warnings = [f.message for f in findings if f.level == "warning"]
    details = {"installed": shown, "errors": errors, "warnings": warnings}
    listed = ", ".join(f"{k} {v}" for k, v in sorted(shown.items()))
    if errors:
        fix = "install the versions named (docs/version_matrix.md): " + "; ".join(errors)
        return CheckResult("versions", "fail", f"{len(errors)} error(s): {errors[0]}", fix, details)
    if warnings:
        fix = "; ".join(warnings)
        return CheckResult(
            "versions", "warn", f"{listed} ({len(warnings)} warning(s))", fix, details
        )
    return CheckResult("versions", "pass", listed, "", details)


def visible_devices_problems(
    acc: Accelerator, env: Mapping[str, str], devices_wanted: int, devices_seen: int | None
) -> tuple[list[str], list[str]]:
    """(failures, warnings) about the visible-devices variables.

    A malformed value fails on every accelerator (a launcher or script wrote it wrongly); on a
    device node, fewer devices seen than the config wants on a node fails too.
    """
    fails: list[str] = []
    warns: list[str] = []
    for name in VISIBLE_VARIABLES:
        value = env.get(name)
        if value is None:
            continue
        if value.strip() == "" or not _INDEX_LIST.match(value):
            fails.append(
                f"{name}={value!r} is not a comma-separated list of device indices: set it to "
                f"e.g. 0,1 or unset it (Ray sets it per worker from its placement)"
            )
            continue
        indices = [v.strip() for v in value.split(",")]
        if len(set(indices)) != len(indices):
            fails.append(f"{name}={value!r} names a device twice: list each device once")
        if name != acc.visible_devices_env:
            what = "no effect" if acc.is_cpu else f"no effect on {acc.name}"
            warns.append(f"{name}={value!r} is set but has {what}")
    own = acc.visible_devices_env
    if own and devices_seen is not None and devices_seen < devices_wanted:
        value = env.get(own)
        where = f"{own}={value!r}" if value is not None else f"no {own}"
        fails.append(
            f"{acc.name}: {devices_seen} device(s) visible with {where}, the plan needs "
            f"{devices_wanted} on a node: point {own} at existing devices (nvidia-smi / npu-smi "
            "list them) or unset it"
        )
    return fails, warns


def environment_check(
    acc: Accelerator,
    *,
    devices_wanted: int,
    env: Mapping[str, str] | None = None,
    devices_seen: int | None = None,
    interfaces: Sequence[str] | None = None,
) -> CheckResult:
    """Visible devices, socket interfaces for NCCL / HCCL / Gloo, and OMP_NUM_THREADS.

    `devices_seen` None asks the accelerator (device nodes only); `interfaces` None lists this
    machine's network interfaces.
    """
    env = os.environ if env is None else env
    if devices_seen is None and not acc.is_cpu:
        devices_seen = acc.device_count()
    fails, warns = visible_devices_problems(acc, env, devices_wanted, devices_seen)
    if interfaces is None:
        import psutil

        interfaces = list(psutil.net_if_addrs())
    for name in IFNAME_VARIABLES:
        value = env.get(name)
        if not value:
            continue
        wanted = [v.strip().lstrip("=") for v in value.split(",") if v.strip()]
        exclusion = value.startswith("^")
        missing = [w for w in wanted if not any(i.startswith(w) for i in interfaces)]
        if missing and not exclusion:
            fails.append(
                f"{name}={value!r}: no interface {', '.join(missing)} on this machine (it has "
                f"{', '.join(sorted(interfaces))}): name one of them, or unset it"
            )
    threads = env.get("OMP_NUM_THREADS")
    cpus = os.cpu_count() or 1
    if threads is not None:
        if not threads.strip().isdigit() or int(threads) < 1:
            fails.append(f"OMP_NUM_THREADS={threads!r} is not a positive integer: fix or unset it")
        elif int(threads) > cpus:
            warns.append(
                f"OMP_NUM_THREADS={threads} is more than the {cpus} CPUs here: each worker would "
                "oversubscribe the cores; unset it (runtime.worker_threads sets workers' threads)"
            )
    shown = {
        k: v
        for k, v in sorted(env.items())
        if k.startswith(PREFIXES_SHOWN) or k in VISIBLE_VARIABLES
    }
    details = {"variables": shown, "failures": fails, "warnings": warns}
    summary = (
        ", ".join(f"{k}={v}" for k, v in shown.items())
        or "none of the variables that matter is set"
    )
    if fails:
        return CheckResult("environment", "fail", fails[0], "; ".join(fails), details)
    if warns:
        return CheckResult("environment", "warn", summary, "; ".join(warns), details)
    return CheckResult("environment", "pass", summary, "", details)
