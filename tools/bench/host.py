"""Which machine a benchmark ran on, written into every report.

docs/benchmarks.md gives each number with its host type, and the hosts differ in what decides
the results: AVX2 only, AVX-512 with avx512_bf16 but no AMX (bf16 may be slower than fp32), or
AMX (bf16 well above fp32). A report that records the CPU's model and these flags says
which host it came from without a separate `lscpu`.
"""

from __future__ import annotations

import os
from typing import Any

from mindrl.accelerator.cpu_precision import cpu_flags, cpuinfo_field, read_cpuinfo

# the flags that decide the matmul rates of a CPU run, in the order of their weight
MATMUL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def host_facts(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU's model name, family / model numbers, its matmul flags and the core count."""
    if cpuinfo is None:
        cpuinfo = read_cpuinfo()
    flags = cpu_flags(cpuinfo)
    family, model = cpuinfo_field(cpuinfo, "cpu family"), cpuinfo_field(cpuinfo, "model")
    return {
        "cpu_model": cpuinfo_field(cpuinfo, "model name") or "unknown",
        "cpu_family_model": f"{family}/{model}" if family and model else None,
        "matmul_flags": [flag for flag in MATMUL_FLAGS if flag in flags],
        "cpu_count": os.cpu_count(),
    }
