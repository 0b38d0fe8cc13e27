"""Run the doctor's checks in order and collect them in a `DoctorReport`.

The host checks need nothing started; the others share one Ray session (the cluster a run
here would join, else an embedded one). A check that raises is a fail naming the error, so
one broken part never hides the others' verdicts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from mindrl.accelerator.versions import Requirement
from mindrl.doctor.report import CheckResult, DoctorReport, machine_description
from mindrl.doctor.settings import DoctorSettings

HOST_CHECKS = ("versions", "environment")
CLUSTER_CHECKS = ("ray", "devices", "save_folder", "collectives", "megatron", "engine")
ALL_CHECKS = HOST_CHECKS + CLUSTER_CHECKS
SLOW_CHECKS = ("megatron", "engine")  # skipped by --quick


def _timed(name: str, check: Callable[[], CheckResult]) -> CheckResult:
    start = time.perf_counter()
    try:
        result = check()
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        result = CheckResult(
            name,
            "fail",
            f"{type(exc).__name__}: {first}",
            "see the error above; rerun with this check alone (--only) for its full log",
        )
    return CheckResult(
        result.name,
        result.status,
        result.summary,
        result.fix,
        result.details,
        time.perf_counter() - start,
    )


def selected_checks(*, quick: bool = False, only: Sequence[str] = ()) -> tuple[str, ...]:
    """The checks to run, in report order: `only` if given, else all but `SLOW_CHECKS` when
    `quick`."""
    unknown = sorted(set(only) - set(ALL_CHECKS))
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}: known are {list(ALL_CHECKS)}")
    if only:
        return tuple(c for c in ALL_CHECKS if c in only)
    return tuple(c for c in ALL_CHECKS if not (quick and c in SLOW_CHECKS))


def run_doctor(
    settings: DoctorSettings,
    *,
    quick: bool = False,
    only: Sequence[str] = (),
    requirements: Sequence[Requirement] | None = None,
    progress: Callable[[CheckResult], None] | None = None,
) -> DoctorReport:
    """Every selected check against `settings`. `requirements`: version rows to check instead
    of the matrix's; `progress`: called with each result as it comes."""
    from mindrl.doctor import cluster_checks, device_checks, host_checks

    acc = settings.accelerator
    names = selected_checks(quick=quick, only=only)
    report = DoctorReport(machine_description(), acc.name, settings.planned_from)

    def add(result: CheckResult) -> None:
        report.results.append(result)
        if progress is not None:
            progress(result)

    need_vllm = settings.rollout_backend == "vllm"  # auto falls back to the HF engine
    host = {
        "versions": lambda: host_checks.versions_check(
            acc, need_vllm=need_vllm, requirements=requirements
        ),
        "environment": lambda: host_checks.environment_check(acc, devices_wanted=settings.tp),
    }
    for name in (n for n in names if n in host):
        add(_timed(name, host[name]))
    wanted = [n for n in names if n in CLUSTER_CHECKS]
    if not wanted:
        return report
    from mindrl.cluster.ray_cluster import start_or_connect
    from mindrl.doctor.remote import cluster_nodes

    started = time.perf_counter()
    try:
        session = start_or_connect(settings.runtime, acc)
    except Exception as exc:
        fix = (
            "joining: check that the cluster at RAY_ADDRESS / runtime.ray_address is up (ray "
            "status); embedded: Ray's logs under /tmp/ray/session_latest/logs say why it did "
            "not start (an overloaded machine times out: rerun)"
        )
        summary = f"no Ray cluster: {type(exc).__name__}: {exc}"
        add(CheckResult("ray", "fail", summary, fix, seconds=time.perf_counter() - started))
        for name in wanted[1:] if wanted[0] == "ray" else wanted:
            add(CheckResult(name, "skip", "no Ray cluster"))
        return report
    with session:
        nodes = cluster_nodes()
        checks: dict[str, Callable[[], CheckResult]] = {
            "ray": lambda: cluster_checks.cluster_check(settings, nodes),
            "devices": lambda: cluster_checks.devices_check(settings, nodes),
            "save_folder": lambda: cluster_checks.save_folder_check(settings, nodes),
            "collectives": lambda: device_checks.collectives_check(settings, nodes),
            "megatron": lambda: device_checks.megatron_check(settings, nodes),
            "engine": lambda: device_checks.engine_check(settings, nodes),
        }
        for name in wanted:
            add(_timed(name, checks[name]))
    return report
