"""`kill -9` of the driver: everything the run started is gone within 10 s.

The driver (`cli/train_grpo.py --config-name grpo_tiny_cpu`, embedded Ray cluster) is killed
with SIGKILL once it is training (metrics.jsonl has a line), so it cannot stop anything
itself. Its process tree recorded just before the kill (GCS, raylet, dashboard, the dashboard
and runtime-env agents, the actor and reference workers, the reward pool, the watchdog) must be
gone within `GONE_WITHIN_S`: the required bound, not a guess at this machine's speed. Before
the watchdog, Ray's two agents lived on for minutes. Leftovers are killed by PID afterwards.

Two fast tests check the watchdog alone on a stand-in driver (no Ray): its orphaned grandchild
that ignores SIGTERM is ended after the driver's SIGKILL, and a clean "stop" touches nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "cli" / "train_grpo.py"
GONE_WITHIN_S = 10.0  # the requirement
START_TIMEOUT_S = 600.0  # until the first step is logged (Ray, workers, engine on a busy box)
KILL_WAIT_S = 10.0  # clean-up of leftovers after a failure
SPAWN_TIMEOUT_S = 60.0  # the stand-in driver reports its children

# A stand-in driver: starts a child that ignores SIGTERM (as a wedged worker might), starts the
# watchdog on itself as start_or_connect does, reports both PIDs, then waits to be killed or
# told to stop cleanly.
FAKE_DRIVER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    from mindrl.cluster.ray_cluster import start_watchdog, stop_watchdog

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", stubborn])
    watchdog = start_watchdog()
    time.sleep(1.5)  # the watchdog records the tree once a second
    print(child.pid, watchdog.pid, flush=True)
    if sys.stdin.readline().strip() == "stop":
        stop_watchdog(watchdog)
        print("stopped", flush=True)
    time.sleep(600)
    """
)


def _gone(proc: psutil.Process) -> bool:
    """Exited; a zombie counts (it is only waiting for its parent to read its status)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.name()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            out.append(f"{p.pid} (gone)")
    return out


def test_sigkill_of_the_driver_leaves_nothing_behind(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    log = tmp_path / "driver.log"
    cmd = [
        sys.executable,
        str(CLI),
        "--config-name",
        "grpo_tiny_cpu",
        f"runtime.output_dir={out}",
        f"actor_config.save={tmp_path / 'ckpt'}",
        "actor_config.train_iters=1000",  # still training when killed
        "actor_config.save_interval=1000",
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with open(log, "w") as fh:
        driver = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True
        )
    family: list[psutil.Process] = []
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + START_TIMEOUT_S
        while driver.poll() is None and time.monotonic() < deadline:
            if metrics.is_file() and metrics.read_text().count("\n") >= 1:
                break
            time.sleep(0.5)
        assert driver.poll() is None, (
            f"driver exited ({driver.returncode}):\n" + (log.read_text()[-4000:])
        )
        assert metrics.is_file(), (
            "no training step within the start timeout:\n" + (log.read_text()[-4000:])
        )
        root = psutil.Process(driver.pid)
        family = root.children(recursive=True)
        names = {p.name() for p in family if not _gone(p)}
        assert {"gcs_server", "raylet"} <= names, names  # the tree really is the run's

        driver.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        driver.wait(timeout=KILL_WAIT_S)
        left = family
        while left and time.monotonic() - killed_at < GONE_WITHIN_S:
            time.sleep(0.1)
            left = [p for p in left if not _gone(p)]
        took = time.monotonic() - killed_at
        print(f"{len(family)} processes of the run gone {took:.1f} s after the driver's SIGKILL")
        assert not left, f"still alive {took:.1f} s after the driver's SIGKILL: {_describe(left)}"
    finally:
        if driver.poll() is None:
            family = [*family, *psutil.Process(driver.pid).children(recursive=True)]
            driver.kill()
            driver.wait(timeout=KILL_WAIT_S)
        stragglers = [p for p in family if not _gone(p)]
        for p in stragglers:
            try:
                p.send_signal(signal.SIGKILL)  # psutil refuses a reused PID
            except psutil.Error:
                pass
        psutil.wait_procs(stragglers, timeout=KILL_WAIT_S)


def _fake_driver() -> tuple[subprocess.Popen, psutil.Process, psutil.Process]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    driver = subprocess.Popen(
        [sys.executable, "-c", FAKE_DRIVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        line = _readline(driver, SPAWN_TIMEOUT_S)
        child_pid, watchdog_pid = (int(x) for x in line.split())
        return driver, psutil.Process(child_pid), psutil.Process(watchdog_pid)
    except BaseException:
        try:
            tree = psutil.Process(driver.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        _kill_all(tree, driver)
        raise


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=timeout_s):
            raise AssertionError(f"no output within {timeout_s} s")
    return proc.stdout.readline()


def _kill_all(procs: list[psutil.Process], driver: subprocess.Popen) -> None:
    driver.kill()
    driver.wait(timeout=KILL_WAIT_S)
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=KILL_WAIT_S)


def test_watchdog_ends_an_orphan_that_ignores_sigterm():
    driver, child, watchdog = _fake_driver()
    try:
        driver.kill()  # SIGKILL: the driver stops nothing itself
        driver.wait(timeout=KILL_WAIT_S)
        killed_at = time.monotonic()
        left = [child, watchdog]
        while left and time.monotonic() - killed_at < GONE_WITHIN_S:
            time.sleep(0.1)
            left = [p for p in left if not _gone(p)]
        assert not left, _describe(left)
    finally:
        _kill_all([child, watchdog], driver)


def test_watchdog_leaves_everything_alone_after_a_clean_stop():
    driver, child, watchdog = _fake_driver()
    try:
        driver.stdin.write("stop\n")
        driver.stdin.flush()
        assert _readline(driver, SPAWN_TIMEOUT_S).strip() == "stopped"
        assert _gone(watchdog)  # stop_watchdog waited for it
        driver.kill()
        driver.wait(timeout=KILL_WAIT_S)
        assert not _gone(child), "the watchdog touched a process after a clean stop"
    finally:
        _kill_all([child, watchdog], driver)
