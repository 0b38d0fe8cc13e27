"""Which precision is fast on this CPU, for the CPU configs (`${cpu_precision:...}`).

bf16 pays on a CPU only where its bf16 matmuls beat fp32: with AMX they do by a wide
margin, on AVX2-only hosts they do not, and on a CPU that shows avx512_bf16 without AMX it
depends on the CPU: there a bf16 run can be slower than an fp32 one (docs/benchmarks.md).
The flags alone do not tell, so where they allow bf16 (amx_bf16 / avx512_bf16) the rates are
measured once per machine (`matmul_probe.py`) and bf16 is taken only at >= BF16_MIN_SPEEDUP
of fp32. The CPU configs then train in megatron's bf16 mixed precision and roll out in bf16,
in fp32 elsewhere. Imports no torch itself (the dry run resolves configs without it): the
probe measures in a child process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from mindrl.accelerator.matmul_probe import MatmulRates, cached_matmul_rates

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # bf16 matmul hardware, as /proc/cpuinfo names it
BF16_MIN_SPEEDUP = 1.25  # bf16 rounds more than fp32: take it only where it clearly pays
CPUINFO = Path("/proc/cpuinfo")


def read_cpuinfo() -> str:
    """`/proc/cpuinfo`'s text; empty where there is none."""
    try:
        return CPUINFO.read_text()
    except OSError:
        return ""


def cpuinfo_field(cpuinfo: str, *keys: str) -> str | None:
    """The first processor's value of the first of `keys` present (`model name`, `flags`...)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's flags (`/proc/cpuinfo`; empty where there is none)."""
    text = read_cpuinfo() if cpuinfo is None else cpuinfo
    return set((cpuinfo_field(text, "flags", "Features") or "").split())


@dataclass(frozen=True)
class CpuPrecision:
    bf16: bool
    reason: str

    @property
    def vllm_dtype(self) -> str:
        return "bfloat16" if self.bf16 else "float32"

    @property
    def name(self) -> str:
        return "bf16" if self.bf16 else "fp32"


def choose_cpu_precision(flags: set[str], rates: MatmulRates | str | None) -> CpuPrecision:
    """The decision, from the flags and the measured rates (or why they could not be measured:
    then only AMX, fast on every host seen, counts as bf16 hardware)."""
    found = [f for f in BF16_FLAGS if f in flags]
    if not found:
        return CpuPrecision(
            False,
            "this CPU has no bf16 matmul hardware (no amx_bf16 / avx512_bf16): fp32 is faster",
        )
    has = f"this CPU has bf16 matmul flags ({', '.join(found)})"
    if not isinstance(rates, MatmulRates):
        amx = "amx_bf16" in found
        return CpuPrecision(
            amx,
            f"{has}, its matmul rates not measured ({rates}): "
            + ("AMX taken as fast" if amx else "without AMX fp32 is assumed faster"),
        )
    measured = (
        f"bf16 matmul at {rates.bf16_speedup:.2f}x fp32 here "
        f"({rates.bf16_gflops:.0f} against {rates.fp32_gflops:.0f} GFLOP/s)"
    )
    if rates.bf16_speedup >= BF16_MIN_SPEEDUP:
        return CpuPrecision(True, f"{has}, {measured}")
    return CpuPrecision(False, f"{has} but {measured}: fp32 is faster")


@functools.cache
def fast_cpu_precision() -> CpuPrecision:
    """This machine's fast precision (the matmul probe runs once per machine, then cached)."""
    cpuinfo = read_cpuinfo()
    flags = cpu_flags(cpuinfo)
    rates: MatmulRates | str | None = None
    if any(f in flags for f in BF16_FLAGS):
        try:
            rates, _ = cached_matmul_rates(cpuinfo)
        except (RuntimeError, OSError, ValueError) as exc:
            rates = str(exc)
    return choose_cpu_precision(flags, rates)
