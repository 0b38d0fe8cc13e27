"""tools/bench/soak.py's bookkeeping without a run: its overrides (valid for the tiny config,
rotation and interval as asked), stable process names, the step read from metrics.jsonl, a real
process tree sampled, and the growth figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.bench import soak


def test_overrides_make_a_valid_tiny_run_with_the_rotation_asked(tmp_path: Path) -> None:
    from mindrl.config import load_run_config

    settings = soak.SoakSettings(steps=60, save_every=10, keep=2)
    run, _ = load_run_config(soak.CONFIG, settings.overrides(tmp_path))
    assert run.actor.ckpt.keep_last_n_checkpoints == 2
    assert run.actor.ckpt.save_interval == 10
    assert run.actor.optim.train_iters == 62  # two past the last multiple
    assert run.runtime.ray_address == "local"


def test_role_drops_the_method_ray_puts_in_a_workers_title() -> None:
    assert soak.role_of("ray::ActorWorker.update", ["ray::ActorWorker.update"]) == (
        "ray::ActorWorker"
    )
    assert soak.role_of("ray::IDLE", ["ray::IDLE"]) == "ray::IDLE"
    raylet = ["/x/ray/core/src/ray/raylet/raylet", "--gcs-address=127.0.0.1:1"]
    assert soak.role_of("raylet", raylet) == "raylet"
    assert soak.role_of("python", ["python", "-m", "mindrl.cluster.launch", "watchdog"]) == (
        "mindrl.cluster.launch"
    )
    assert soak.role_of("python", ["python", "cli/train_grpo.py", "--x"]) == "train_grpo.py"
    spawned = ["python", "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]
    assert soak.role_of("python", spawned) == "multiprocessing.spawn"


def test_last_step_skips_validation_rows_and_a_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert soak.last_step(path) == 0
    rows = [{"step": 1, "timing/step": 1.0}, {"step": 2, "timing/step": 1.0}, {"step": 3}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "tim')
    assert soak.last_step(path) == 2


def test_sample_reads_a_real_process_tree(tmp_path: Path) -> None:
    """A parent with a child holding an extra open file and thread: both are found, with
    their fds and threads; the checkpoint folder's names and bytes are read."""
    ready = tmp_path / "ready"
    child_code = (
        "import pathlib, threading, time; f = open(__file__); "
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
        f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    )
    script = tmp_path / "child.py"
    script.write_text(child_code)
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, {str(script)!r}])"
    parent = subprocess.Popen([sys.executable, "-c", launcher])
    try:
        (tmp_path / "out" / "ckpt" / "iter_0000010").mkdir(parents=True)
        (tmp_path / "out" / "ckpt" / "iter_0000010" / "w.bin").write_bytes(b"x" * 1000)
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        sample = soak.sample_run(parent.pid, 10, tmp_path / "out")
        roles = {p.role: p for p in sample.processes}
        assert len(sample.processes) == 2 and "child.py" in roles
        child = roles["child.py"]
        assert child.threads >= 2 and child.fds >= 4 and child.rss_mib > 1
        assert sample.checkpoints == ["iter_0000010"] and sample.checkpoint_bytes == 1000
        assert sample.object_store_bytes is None  # no Ray cluster in this tree
    finally:
        for proc in soak_children(parent.pid):
            os.kill(proc, 9)
        parent.kill()
        parent.wait()


def soak_children(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _sample(
    step: int, rss: dict[int, float], fds: int, store: int, ckpts: list[str]
) -> soak.Sample:
    procs = [soak.ProcessSample(pid, f"role{pid}", mib, fds, 10) for pid, mib in rss.items()]
    return soak.Sample(step, 0.0, procs, store, 1, ckpts, 100 * len(ckpts), step * 10, step, 0)


def test_growth_compares_the_warm_sample_with_the_last() -> None:
    samples = [
        _sample(50, {1: 100.0, 2: 200.0}, 5, 900, ["iter_50"]),
        _sample(100, {1: 110.0, 2: 200.0}, 5, 0, ["iter_50", "iter_100"]),
        _sample(150, {1: 121.0, 2: 200.0, 3: 50.0}, 6, 0, ["iter_100", "iter_150"]),
    ]
    g = soak.growth(samples, warmup_step=100)
    assert (g["from_step"], g["to_step"]) == (100, 150)
    assert g["per_process"]["role1[1]"]["rss_growth_pct"] == 10.0
    assert g["max_rss_growth_pct"] == 10.0
    assert g["fds_delta"] == 3 * 6 - 2 * 5 and g["processes_started"] == ["role3[3]"]
    assert g["object_store_bytes"] == [0, 0] and g["max_checkpoints_kept"] == 2
    assert g["log_bytes_per_step"] == 10.0
    line = soak.summary_line(g)
    assert line.startswith("soak: steps 100->150") and "worst process +10.00%" in line
    with pytest.raises(ValueError, match="after step 200"):
        soak.growth(samples, warmup_step=200)
