"""tools/bench/lora.py's and training_run.py's bookkeeping: the two runs' overrides,
metrics.jsonl parsing, the driver's parameter line and the summary (no training run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tools.bench import lora, training_run


def test_the_lora_run_differs_from_full_only_by_the_adapter_keys(tmp_path):
    common = training_run.common_overrides(4, tmp_path / "full")
    assert "megatron_training.train_iters=4" in common
    assert f"runtime.output_dir={tmp_path / 'full'}" in common
    assert "actor_config.save=null" in common  # no step checkpoints

    extra = lora.lora_overrides(16, 32, 1e-4)
    assert "megatron_training.lora_r=16" in extra
    assert "megatron_training.lora_alpha=32" in extra
    assert (
        "megatron_training.lora_target_modules=[linear_qkv,linear_proj,linear_fc1,linear_fc2]"
        in extra
    )
    assert "actor_config.lr=0.0001" in extra
    # the shared backbone needs the integrated worker; it replaces the shipped weight snapshot
    assert {"rl_config.use_integrated_worker=true", "rl_config.share_backbone=true"} <= set(extra)
    assert "rl_config.reference_in_actor=false" in extra
    # nothing in the full run's list that the LoRA run overrides differently
    assert not {o.split("=")[0] for o in common} & {o.split("=")[0] for o in extra}

    cmd = training_run.train_command("grpo_smollm2_cpu", common + extra)
    assert cmd[0] == sys.executable
    assert cmd[1:4] == ["cli/train_grpo.py", "--config-name", "grpo_smollm2_cpu"]
    assert cmd[4:] == common + extra


def test_the_overrides_compose_into_valid_configs(tmp_path):
    # the real config with the bench's lists: both validate, LoRA with the shared backbone
    from mindrl.config import load_run_config

    def load(*extra: str):
        overrides = training_run.common_overrides(4, tmp_path / "run") + list(extra)
        return load_run_config("grpo_smollm2_cpu", overrides, check_paths=False)[0]

    full = load()
    assert not full.actor.lora.enabled and not full.shares_backbone
    assert full.actor.ckpt.save is None
    run = load(*lora.lora_overrides(16, 32, 1e-4))
    assert run.actor.lora.enabled and run.actor.lora.lora_r == 16 and run.actor.lora.scale == 2.0
    assert run.actor.lora.targets == lora.LORA_TARGETS
    assert run.shares_backbone and [r.role for r in run.roles] == ["actor"]
    assert run.actor.ckpt.save is None


def _metrics_line(step: int, seconds: float, score: float | None, **timing: float) -> str:
    record = {"step": step, "timing/step": seconds, "grpo/score": score}
    record.update({f"timing/{k}": v for k, v in timing.items()})
    return json.dumps(record)


def test_metrics_parse_into_steps_and_the_summary_skips_step_one():
    text = "\n".join(
        [
            _metrics_line(1, 100.0, 0.1, rollout=40.0, ref=10.0, update=45.0, update_fwd_bwd=30.0),
            _metrics_line(2, 30.0, 0.2, rollout=10.0, ref=4.0, update=15.0, update_fwd_bwd=12.0),
            json.dumps({"step": 2, "val/score": 0.5}),  # a validation record of the same step
            _metrics_line(3, 50.0, None, rollout=20.0, ref=6.0, update=21.0, update_fwd_bwd=14.0),
            "",
        ]
    )
    steps = training_run.parse_metrics(text)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert steps[1]["reward"] == 0.2 and steps[2]["reward"] is None
    assert steps[0]["phases"]["rollout"] == 40.0
    assert steps[0]["phases"]["other"] == pytest.approx(5.0)  # 100 - 40 - 10 - 45
    assert steps[0]["detail"] == {"update_fwd_bwd": 30.0}  # sub-phases are not in "other"

    s = training_run.summarize(steps, peak_pss_gib=3.5)
    assert s["s_per_step"] == pytest.approx(40.0)
    assert s["step1_s"] == 100.0
    assert s["phase_s"]["rollout"] == pytest.approx(15.0)
    assert s["phase_s"]["other"] == pytest.approx(2.0)  # (1 + 3) / 2
    assert s["detail_s"] == {"update_fwd_bwd": pytest.approx(13.0)}
    assert s["rewards"] == [0.1, 0.2, None]
    assert s["reward_mean"] == pytest.approx(0.15)  # over the steps that have one
    assert s["peak_pss_gib"] == 3.5


def test_trainable_parameters_come_from_the_driver_log_and_full_is_derived():
    log = (
        "2025 INFO mindrl.trainer.setup: trainable parameters: 4884480 of 139399488 "
        "(3.504%, LoRA r=16 on linear_qkv, linear_proj, linear_fc1, linear_fc2)\n"
    )
    assert training_run.parse_trainable(log) == (4884480, 139399488)
    assert training_run.parse_trainable("no such line\n") is None

    results = {
        "full": {"trainable_params": None, "total_params": None},
        "lora": {"trainable_params": 10, "total_params": 110},
    }
    lora.fill_full_params(results)
    assert results["full"]["trainable_params"] == 100 == results["full"]["total_params"]
    lora.fill_full_params({"full": {"error": "boom"}, "lora": results["lora"]})  # no raise


def test_summary_line_gives_both_runs_and_the_lora_over_full_ratios():
    def run(seconds: float, gib: float, steady: dict | None = None) -> dict:
        machine = {"steady": steady} if steady else {}
        return {"summary": {"s_per_step": seconds, "peak_pss_gib": gib}, "machine": machine}

    line = lora.summary_line({"full": run(40.0, 10.0), "lora": run(30.0, 6.5)})
    assert line == (
        "lora: step_time full=40.0s lora=30.0s (x0.75) peak_pss full=10.00GiB lora=6.50GiB (x0.65)"
    )
    line = lora.summary_line(
        {
            "full": run(40.0, 10.0, {"cpu_s_per_step": 70.0, "cpu_share": 0.875}),
            "lora": run(30.0, 6.5, {"cpu_s_per_step": 35.0, "cpu_share": 0.6}),
        }
    )
    assert line.endswith(" cpu_s full=70.0 lora=35.0 (x0.50) cpu_share full=0.88 lora=0.60")


def test_a_failed_run_stops_the_bench(tmp_path, monkeypatch):
    # the run itself is tools/bench/e2e.py's run_tree: a failing command stops the bench
    monkeypatch.setattr(
        training_run,
        "train_command",
        lambda config, overrides, script: [sys.executable, "-c", "raise SystemExit(2)"],
    )
    with pytest.raises(SystemExit, match="exit code 2"):
        training_run.run_one("full", "cfg", [], Path(tmp_path) / "full", timeout_s=60)


def test_the_contention_sampler_counts_the_trees_cpu_time():
    import subprocess
    import time

    import psutil

    def burn(seconds: float, then_sleep: float = 0.0) -> str:
        return (
            "import time; t = time.process_time()\n"
            f"while time.process_time() - t < {seconds}: pass\n"
            f"time.sleep({then_sleep})"
        )

    # a child that was running before the meter (a test runner's worker) is not the run's
    older = subprocess.Popen([sys.executable, "-c", burn(2.0, then_sleep=30.0)])
    try:
        deadline = time.monotonic() + 60
        while sum(psutil.Process(older.pid).cpu_times()[:2]) < 2.0:
            assert time.monotonic() < deadline, "the older child never burned its 2 s"
            time.sleep(0.1)
        meter = training_run.Contention(interval_s=0.1)
        subprocess.run([sys.executable, "-c", burn(1.0)], check=True)
        time.sleep(0.3)
        machine = meter.stop()
    finally:
        older.kill()
        older.wait()
    assert machine["tree_cpu_s"] > 0.5  # the child's busy second, sampled before it exited
    assert machine["tree_cpu_s"] < 2.0  # and not the older child's 2 s
    assert 0.0 < machine["cpu_share"] <= 1.0 and machine["load1_max"] >= 0.0
    # a window: interpolated between samples, nothing before the first sample
    meter.samples = [(10.0, 1.0, 0.0), (20.0, 3.0, 10.0), (30.0, 5.0, 30.0)]
    w = meter.window(15.0, 25.0)
    assert w["tree_cpu_s"] == pytest.approx(15.0)  # 5 at t=15, 20 at t=25
    assert w["load1_mean"] == 3.0
    assert meter.window(0.0, 10.0)["tree_cpu_s"] == 0.0


def test_a_failed_run_is_recorded_and_the_other_still_runs(tmp_path, monkeypatch):
    steps = training_run.parse_metrics("\n".join(_metrics_line(i, 10.0, 0.1) for i in (1, 2)))

    def fake_run(name, config, overrides, out_dir, timeout_s, pss_gate_mib=None):
        if name == "full":
            raise SystemExit("cli/train_grpo.py ran past 10 s")
        machine = {"load1_mean": 1.0, "load1_max": 1.0, "tree_cpu_s": 1.0, "cpu_share": 0.5}
        return {
            "machine": machine,
            "trainable_params": 1,
            "summary": training_run.summarize(steps, 2.0),
        }

    monkeypatch.setattr(training_run, "run_one", fake_run)
    out = tmp_path / "lora.json"
    assert lora.main(["--steps", "2", "--out", str(out)]) == 1
    runs = json.loads(out.read_text())["runs"]
    assert runs["full"] == {"error": "cli/train_grpo.py ran past 10 s"}
    assert runs["lora"]["summary"]["s_per_step"] == 10.0
