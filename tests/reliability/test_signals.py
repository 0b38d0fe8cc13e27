"""SIGTERM / SIGINT during a real run (`cli/train_grpo.py --config-name grpo_tiny_cpu`, real
Ray, megatron and vLLM workers): the run stops, says where in one line, exits 128 + N, keeps
no half-written checkpoint, and leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300.0  # bounds the wait for the first steps (worker_timeout_s is 600)
GRACE_S = 30.0  # runtime.stop_grace_s below: the run must end within it after the signal
GONE_S = 10.0  # the requirement: everything the run started is gone within 10 s

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def _start(out: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(ROOT / "cli" / "train_grpo.py"),
        "--config-name",
        "grpo_tiny_cpu",
        "actor_config.train_iters=200",
        "megatron_training.save_interval=2",
        f"runtime.output_dir={out}",
        f"actor_config.save={out}/ckpt",
        f"runtime.stop_grace_s={GRACE_S}",
    ]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a job under a shell
    )


def _wait_for_steps(proc: subprocess.Popen, out: Path, steps: int) -> None:
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and metrics.read_text().count("\n") >= steps:
            return
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"the run did not reach step {steps}: {proc.communicate()[1][-3000:]}")


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _assert_gone(procs: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(procs, timeout=GONE_S)
    for p in alive:  # clean up by pid before failing
        p.kill()
    assert not alive, [f"{p.pid} {p.name()}" for p in alive]


@pytest.mark.parametrize(
    ("signum", "to_group", "code"),
    [(signal.SIGTERM, False, 143), (signal.SIGINT, True, 130)],
    ids=["sigterm-driver", "sigint-process-group"],
)
def test_stop_signal_ends_the_run_cleanly(tmp_path, tiny_model_dir, signum, to_group, code):
    out = tmp_path / "run"
    proc = _start(out)
    try:
        _wait_for_steps(proc, out, 3)
        family = _tree(proc.pid)
        if to_group:  # what Ctrl-C in a terminal does
            os.killpg(proc.pid, signum)
        else:  # what `kill PID`, a scheduler or a container runtime does
            os.kill(proc.pid, signum)
        stdout, stderr = proc.communicate(timeout=GRACE_S + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("interrupted at step")]
    assert len(lines) == 1, stderr[-3000:]
    step = int(lines[0].split()[3].rstrip(";"))
    assert step >= 3
    ckpt = out / "ckpt"
    saved = sorted(p.name for p in ckpt.glob("iter_*"))
    assert saved, "save_interval=2 and >= 3 steps: a checkpoint exists"
    assert lines[0].endswith(f"last checkpoint {saved[-1]}")
    assert not list(ckpt.glob(".iter_*")), "a half-written checkpoint was left"
    assert (ckpt / saved[-1] / "manifest.json").is_file()
    _assert_gone(family)
