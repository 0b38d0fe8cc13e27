"""A dead actor worker ends the run with a clear message before the configured worker timeout
could have fired (the death is noticed, not waited out), leaving nothing behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import psutil

from tests.e2e._run import ROOT, train_cmd

WORKER_TIMEOUT_S = 300.0  # runtime.worker_timeout_s of the run: a hung call fails after this
START_TIMEOUT_S = 240.0  # for the run to start and log two steps
CLEANUP_TIMEOUT_S = 60.0  # for the run's processes to be gone once the driver has exited


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_killed_actor_worker_ends_the_run(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    log = tmp_path / "driver.log"
    cmd = train_cmd(
        out, "actor_config.train_iters=1000", f"runtime.worker_timeout_s={WORKER_TIMEOUT_S:g}"
    )
    with open(log, "w") as fh:
        driver = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        actor_pid = None
        while time.monotonic() < deadline and driver.poll() is None:
            m = re.search(r"\(ActorWorker pid=(\d+)\)", log.read_text())
            metrics = out / "metrics.jsonl"
            if m and metrics.is_file() and metrics.read_text().count("\n") >= 2:
                actor_pid = int(m.group(1))
                break
            time.sleep(0.5)
        assert actor_pid is not None, log.read_text()[-3000:]
        family = [psutil.Process(driver.pid), *psutil.Process(driver.pid).children(recursive=True)]
        os.kill(actor_pid, signal.SIGKILL)
        # a run that only gave up when its call timed out would still be running here
        rc = driver.wait(timeout=WORKER_TIMEOUT_S)
        text = log.read_text()
        assert rc != 0
        assert re.search(r"error: actor worker rank 0 died", text), text[-3000:]
        assert "did not finish within" not in text  # the death was noticed, not timed out
        deadline = time.monotonic() + CLEANUP_TIMEOUT_S
        while _running(family) and time.monotonic() < deadline:
            time.sleep(0.5)
        alive = _running(family)
        assert not alive, [p.cmdline()[:3] for p in alive]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
