"""The console shows mindrl's progress, warnings and errors; vLLM / Ray chatter goes to files.

Two real `grpo_tiny_cpu` runs of 2 steps (embedded Ray, megatron actor with its vLLM engine):
with the default `runtime.log_level` (info) the console (stdout + stderr) has one progress
line per step and none of vLLM's per-step lines (`Reloading and processing weights`,
`Failed to load weights`, `Successfully reset prefix cache`, INFO records), which are in
`OUTPUT_DIR/logs/actor_rank0.log` instead; with `runtime.log_level=debug` they are on the
console too. A fast test checks the worker-side routing on its own, in a fresh process: a
library's INFO record, a print and native stderr output go to the file, a mindrl warning and
a library error to the console.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "cli" / "train_grpo.py"
STEPS = 2
RUN_TIMEOUT_S = 900.0  # a whole 2-step run, Ray and engine start-up included, on a busy box
SCRIPT_TIMEOUT_S = 120.0

# vLLM's per-step lines (weight reload after every update) and its INFO records, in vLLM's
# own format ("INFO 11-24 00:23:15 [inplace.py:113] ...") or through mindrl's handlers
# ("INFO vllm.model_executor...: ...").
ENGINE_CHATTER = (
    "Reloading and processing weights",
    "Failed to load weights",
    "Successfully reset prefix cache",
)
VLLM_INFO = re.compile(r"\bINFO\b.*(\[\w+\.py:\d+\]|\bvllm\.)")
PROGRESS = re.compile(rf"^\[\s*(\d+)/{STEPS}\s+\d+%\] ", re.MULTILINE)


def _train(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "run"
    cmd = [sys.executable, str(CLI), "--config-name", "grpo_tiny_cpu"]
    cmd += [f"runtime.output_dir={out}", f"actor_config.save={tmp_path / 'ckpt'}"]
    cmd += [f"actor_config.train_iters={STEPS}", f"actor_config.save_interval={STEPS}"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [*cmd, *overrides],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, out


def _chatter(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if any(c in line for c in ENGINE_CHATTER) or VLLM_INFO.search(line)
    ]


@pytest.mark.slow
@pytest.mark.vllm
def test_default_console_is_progress_and_problems_only(tmp_path, tiny_model_dir):
    pytest.importorskip("vllm")
    proc, out = _train(tmp_path)
    console = proc.stdout + proc.stderr
    assert [int(n) for n in PROGRESS.findall(proc.stdout)] == list(range(1, STEPS + 1)), (
        proc.stdout[-3000:]
    )
    assert not _chatter(console), _chatter(console)[:10]
    logs = out / "logs"
    assert f"worker, engine and Ray logs: {logs.resolve()}" in proc.stderr
    engine_log = (logs / "actor_rank0.log").read_text()
    # the weight sync's vLLM lines go to the file (its reload lines only where vLLM's
    # reload runs: the direct path on CPU has none)
    assert "Successfully reset prefix cache" in engine_log
    assert VLLM_INFO.search(engine_log)
    assert (logs / "ref_rank0.log").is_file()
    driver_log = (logs / "driver.log").read_text()
    assert "Started a local Ray instance" in driver_log  # Ray's driver-side lines: file only
    assert "Started a local Ray instance" not in console


@pytest.mark.slow
@pytest.mark.vllm
def test_debug_level_shows_engine_logs_on_the_console(tmp_path, tiny_model_dir):
    pytest.importorskip("vllm")
    proc, out = _train(tmp_path, "runtime.log_level=debug")
    console = proc.stdout + proc.stderr
    assert len(PROGRESS.findall(proc.stdout)) == STEPS
    assert "Successfully reset prefix cache" in console  # the weight sync's vLLM line
    assert VLLM_INFO.search(console)
    assert "Started a local Ray instance" in console
    assert "Successfully reset prefix cache" in (out / "logs" / "actor_rank0.log").read_text()


WORKER = textwrap.dedent(
    """
    import logging, os, sys, warnings

    from mindrl.logs import setup_worker_logging

    path = setup_worker_logging()
    assert setup_worker_logging() is None  # once per process
    logging.getLogger("vllm.fake").info("engine info line")
    logging.getLogger("vllm.fake").warning("engine warning line")
    logging.getLogger("vllm.fake").error("engine error line")
    logging.getLogger("mindrl.fake").info("mindrl info line")
    logging.getLogger("mindrl.fake").warning("mindrl warning line")
    warnings.warn("library warning line")
    print("printed line")
    os.write(2, b"native stderr line\\n")
    print(path)
    """
)


@pytest.mark.parametrize("level", ["info", "warning", "debug"])
def test_worker_routing(tmp_path, level):
    env = dict(os.environ, MINDRL_LOG_DIR=str(tmp_path), MINDRL_LOG_LEVEL=level)
    env.update(MINDRL_ROLE="actor", RANK="3", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", WORKER],
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    logfile = tmp_path / "actor_rank3.log"
    text = logfile.read_text()
    for line in ("engine info line", "engine error line", "mindrl warning line"):
        assert line in text, line
    assert "library warning line" in text and "py.warnings" in text
    console = proc.stdout + proc.stderr
    assert "engine error line" in console and "mindrl warning line" in console
    where = f"actor rank 3: log {logfile}"
    assert (where in proc.stderr) == (level != "warning")
    if level != "debug":
        for line in ("printed line", "native stderr line", str(logfile)):
            assert line in text, line  # stdout / stderr of the process: the file
        for line in ("engine info line", "engine warning line", "mindrl info line"):
            assert line not in console, line
        assert "library warning line" not in console and "printed line" not in console
    else:
        for line in ("engine info line", "engine warning line", "printed line"):
            assert line in console, line
