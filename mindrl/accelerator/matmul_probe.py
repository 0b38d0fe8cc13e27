"""This CPU's fp32 and bf16 matmul rates, measured once per machine and kept on disk.

Why measured: the bf16 flags do not say bf16 is fast. Where a hypervisor shows avx512_bf16
but not AMX, oneDNN's bf16 matmul can run below the fp32 rate, while with AMX it runs well
above it. So where the flags allow bf16, `cpu_precision` asks this probe. It runs in a child
process (the driver and the dry run resolve configs without importing torch) and its answer is
cached per machine: CPU model, flags, core count and torch version (`~/.cache/mindrl/`,
`$MINDRL_CACHE_DIR`).

`python -m mindrl.accelerator.matmul_probe` prints the measurement as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

PROBE_SIZE = 1024  # square matmul: big enough for the blocked kernels, small enough to repeat
PROBE_CALLS = 4  # per timing; the best of PROBE_ROUNDS interleaved timings counts
PROBE_ROUNDS = 3
PROBE_TIMEOUT_S = 120.0  # torch's import dominates; a stuck child must not stall the config


@dataclass(frozen=True)
class MatmulRates:
    fp32_gflops: float
    bf16_gflops: float

    @property
    def bf16_speedup(self) -> float:
        return self.bf16_gflops / max(self.fp32_gflops, 1e-9)


def cache_dir() -> Path:
    env = os.environ.get("MINDRL_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mindrl"


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_key(cpuinfo: str) -> str:
    """What the rates depend on: the CPU (model line and flags), the cores we may use, torch."""
    lines = [
        ln
        for ln in cpuinfo.splitlines()
        if ln.split(":")[0].strip() in ("model name", "flags", "cpu family", "model")
    ]
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    text = "\n".join(sorted(set(lines))) + f"\ncores={usable_cores()}\ntorch={torch_version}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def measure_in_this_process() -> MatmulRates:
    """Best-of-rounds rate per dtype, the dtypes interleaved so a slow stretch hits both."""
    import torch

    flop = 2 * PROBE_SIZE**3 * PROBE_CALLS
    best = {torch.float32: 0.0, torch.bfloat16: 0.0}
    pairs = {
        dt: (
            torch.randn(PROBE_SIZE, PROBE_SIZE, dtype=dt),
            torch.randn(PROBE_SIZE, PROBE_SIZE, dtype=dt),
        )
        for dt in best
    }
    for a, b in pairs.values():
        a @ b  # warm: oneDNN builds its kernels on the first call
    for _ in range(PROBE_ROUNDS):
        for dtype, (a, b) in pairs.items():
            start = time.perf_counter()
            for _ in range(PROBE_CALLS):
                a @ b
            best[dtype] = max(best[dtype], flop / (time.perf_counter() - start) / 1e9)
    return MatmulRates(round(best[torch.float32], 1), round(best[torch.bfloat16], 1))


def measure_in_child(timeout_s: float = PROBE_TIMEOUT_S) -> MatmulRates:
    """Run the probe in a fresh interpreter; raises RuntimeError with its stderr if it fails."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mindrl.accelerator.matmul_probe"],
            env={**os.environ, "OMP_NUM_THREADS": str(usable_cores())},  # all cores, as runs
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"the matmul probe took over {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        raise RuntimeError(f"the matmul probe failed: {done.stderr.strip()[-300:]}")
    return MatmulRates(**json.loads(done.stdout.strip().splitlines()[-1]))


def cached_matmul_rates(cpuinfo: str) -> tuple[MatmulRates, Path]:
    """This machine's rates from the cache, measured (and cached) the first time."""
    path = cache_dir() / f"cpu_matmul_rates_{machine_key(cpuinfo)}.json"
    try:
        return MatmulRates(**json.loads(path.read_text())), path
    except (OSError, ValueError, TypeError):
        pass
    rates = measure_in_child()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(asdict(rates)))
        partial.replace(path)  # atomic: concurrent resolutions read a whole file or none
    except OSError:
        pass  # a read-only home: the measurement still counts, it is just made again next time
    return rates, path


if __name__ == "__main__":
    print(json.dumps(asdict(measure_in_this_process())))
