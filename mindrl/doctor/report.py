"""The doctor's findings: one `CheckResult` per check, the `DoctorReport` that holds them, and
the two ways it is shown (console lines, a JSON file) so a user can paste either into an issue."""

from __future__ import annotations

import json
import os
import platform
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["pass", "warn", "fail", "skip"]
SYMBOLS: dict[str, str] = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict. `fix` says what to do when it is not a pass; `details` holds what
    was measured or found (versions, nodes, bandwidths) for the JSON report."""

    name: str
    status: Status
    summary: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def machine_description() -> dict[str, Any]:
    """What names the machine in a report: host, OS, CPU, cores and memory."""
    import psutil

    return {
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpus": os.cpu_count() or 1,
        "memory_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass
class DoctorReport:
    """Every check's result, the machine and what the checks were planned from."""

    machine: dict[str, Any]
    accelerator: str
    planned_from: str  # "defaults" or the config's name
    results: list[CheckResult] = field(default_factory=list)

    @property
    def status(self) -> Status:
        """fail if any check failed, else warn if any warned, else pass."""
        found = {r.status for r in self.results}
        return "fail" if "fail" in found else "warn" if "warn" in found else "pass"

    def result(self, name: str) -> CheckResult:
        return next(r for r in self.results if r.name == name)

    def console_lines(self) -> list[str]:
        m = self.machine
        lines = [
            f"mindrl doctor on {m['host']}: {m['os']} {m['machine']}, {m['processor']}, "
            f"{m['cpus']} CPU(s), {m['memory_gib']} GiB, Python {m['python']}",
            f"accelerator: {self.accelerator}; planned from {self.planned_from}",
        ]
        for r in self.results:
            lines.append(f"[{SYMBOLS[r.status]}] {r.name:<11} {r.summary} ({r.seconds:.1f} s)")
            if r.fix and r.status != "pass":
                lines.append(f"       fix: {r.fix}")
        counts = ", ".join(
            f"{sum(r.status == s for r in self.results)} {s}" for s in ("pass", "warn", "fail")
        )
        lines.append(f"doctor: {self.status} ({counts})")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "accelerator": self.accelerator,
            "planned_from": self.planned_from,
            "status": self.status,
            "checks": [asdict(r) for r in self.results],
        }

    def write_json(self, path: str | Path) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")
