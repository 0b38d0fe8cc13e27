"""Launch N ranks of `_mp_worker.py` over gloo on 127.0.0.1, bounded in time.

Each rank is a subprocess with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set; on failure
or timeout every rank still running is killed by its pid and the error names the rank and the
tail of its stderr.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("_mp_worker.py")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(spec: dict[str, Any], world_size: int, workdir: Path, timeout_s: float = 240) -> None:
    """Run the worker on `world_size` ranks with `spec` (JSON); raise if any rank fails."""
    spec_path = workdir / f"spec_{time.monotonic_ns()}.json"
    spec_path.write_text(json.dumps(spec))
    port = free_port()
    procs = []
    logs = []
    for rank in range(world_size):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            MINDRL_ACCELERATOR="cpu",
            PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        log = open(workdir / f"rank{rank}_{spec_path.stem}.log", "w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), str(spec_path)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(REPO),
            )
        )
    deadline = time.monotonic() + timeout_s
    failed: list[str] = []
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                failed.append(f"timeout after {timeout_s:.0f}s")
                break
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(2)  # let the others report, then stop them
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for rank, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        text = log.read()
        log.close()
        if p.returncode != 0:
            tail = "\n".join(text.strip().splitlines()[-25:])
            failed.append(f"rank {rank} exited with {p.returncode}:\n{tail}")
    if failed:
        raise RuntimeError("multi-process run failed:\n" + "\n".join(failed))
