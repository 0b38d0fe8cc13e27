"""A dead actor worker ends the run with a clear message, within 60 s, leaving nothing behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from tests.e2e._run import ROOT, train_cmd

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]


def test_killed_actor_worker_ends_the_run(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    log = tmp_path / "driver.log"
    with open(log, "w") as fh:
        driver = subprocess.Popen(
            train_cmd(out, "actor_config.train_iters=1000"),
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        actor_pid = None
        while time.monotonic() < deadline and driver.poll() is None:
            m = re.search(r"\(ActorWorker pid=(\d+)\)", log.read_text())
            metrics = out / "metrics.jsonl"
            if m and metrics.is_file() and metrics.read_text().count("\n") >= 2:
                actor_pid = int(m.group(1))
                break
            time.sleep(0.5)
        assert actor_pid is not None, log.read_text()[-3000:]
        family = [driver.pid] + [p.pid for p in psutil.Process(driver.pid).children(recursive=True)]
        os.kill(actor_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        rc = driver.wait(timeout=90)
        took = time.monotonic() - killed_at
        text = log.read_text()
        assert rc != 0
        assert took < 60, took
        assert re.search(r"error: actor worker rank 0 died", text), text[-3000:]
        time.sleep(3)
        alive = [
            p
            for p in family
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        assert not alive, [psutil.Process(p).cmdline()[:3] for p in alive]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
