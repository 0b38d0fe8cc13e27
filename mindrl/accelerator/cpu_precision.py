"""Which precision is fast on this CPU, for the CPU configs (`${cpu_precision:...}`).

bf16 pays on a CPU only with bf16 matmul hardware (AVX512-BF16 or AMX): measured on an AMD
EPYC with avx512_bf16, a 2048^2 matmul ran 755 GFLOP/s in bf16 against 156 in fp32 and the
SmolLM2 step 2.5x faster in bf16; on the AVX2-only hosts bf16 matmuls run at about half the
fp32 rate and every bf16 run was slower. So the CPU configs train in megatron's bf16 mixed
precision and roll out in bf16 where the hardware has it, in fp32 elsewhere. Reads the flags
the kernel reports (no torch import: the dry run resolves configs without it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # bf16 matmul hardware, as /proc/cpuinfo names it
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's flags (`/proc/cpuinfo`; empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


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


def fast_cpu_precision(flags: set[str] | None = None) -> CpuPrecision:
    flags = cpu_flags() if flags is None else flags
    found = [f for f in BF16_FLAGS if f in flags]
    if found:
        return CpuPrecision(True, f"this CPU has bf16 matmul hardware ({', '.join(found)})")
    return CpuPrecision(
        False, "this CPU has no bf16 matmul hardware (no amx_bf16 / avx512_bf16): fp32 is faster"
    )
