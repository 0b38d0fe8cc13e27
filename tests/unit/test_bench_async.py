"""tools/bench/async.py's bookkeeping: the runs' keys (valid for the tiny config), the
pipeline metrics, tokens per second and idle fraction read from metrics.jsonl, the cluster
model and the summary (no run)."""

from __future__ import annotations

import importlib
import json

import pytest

bench = importlib.import_module("tools.bench.async")  # `async` is a keyword


def test_every_run_puts_rollout_on_its_own_devices_with_long_responses():
    from mindrl.config import load_run_config

    for staleness in (0, 1, 2, 4):
        run, _ = load_run_config("grpo_tiny_cpu", bench.variant_overrides(staleness, 96))
        assert run.rl.resources.rollout_resource.num_npus == 1
        assert run.rl.resources.rollout_staleness == staleness
        assert run.generate.sampling_config.max_tokens == 96
        assert run.generate.sampling_config.ignore_eos


def test_pipeline_metrics_are_read_over_steps_two_to_n(tmp_path):
    rows = [
        {"step": 1, "timing/step": 5.0, "e2e_tps": 1.0, "rollout/staleness": 0.0},
        {
            "step": 2,
            "timing/step": 2.0,
            "e2e_tps": 100.0,
            "rollout/staleness": 1.0,
            "timing/overlap": 0.5,
            "timing/trainer_wait_samples": 0.5,
        },
        {
            "step": 3,
            "timing/step": 3.0,
            "e2e_tps": 50.0,
            "rollout/staleness": 2.0,
            "timing/overlap": 0.7,
            "timing/trainer_wait_samples": 0.0,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    got = bench.pipeline_means(tmp_path)
    assert got["rollout/staleness"] == 1.5
    assert got["timing/overlap"] == pytest.approx(0.6)
    assert got["tokens_per_s"] == pytest.approx(350.0 / 5.0)
    assert got["trainer_idle_fraction"] == pytest.approx(0.5 / 5.0)


def test_a_synchronous_trainer_idles_through_the_rollout(tmp_path):
    rows = [
        {"step": 1, "timing/step": 5.0, "e2e_tps": 1.0, "timing/rollout": 4.0},
        {"step": 2, "timing/step": 4.0, "e2e_tps": 10.0, "timing/rollout": 3.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert bench.pipeline_means(tmp_path)["trainer_idle_fraction"] == pytest.approx(0.75)


def test_the_cluster_model_hides_the_shorter_of_rollout_and_training():
    assert bench.expected_speedup(0.7, 0.28, 0.02) == pytest.approx(1.0 / 0.72)
    assert bench.expected_speedup(0.5, 0.5, 0.0) == pytest.approx(2.0)
    assert bench.expected_speedup(1.0, 0.0, 0.0) == pytest.approx(1.0)


def test_summary_line_compares_two_steps_off_with_synchronous():
    def run(s_per_step, tps, idle, reward):
        return {
            "summary": {"s_per_step": s_per_step, "reward_mean": reward},
            "pipeline": {"tokens_per_s": tps, "trainer_idle_fraction": idle},
        }

    line = bench.summary_line({"k0": run(2.0, 100.0, 0.6, 0.5), "k2": run(1.5, 150.0, 0.1, 0.55)})
    assert line == (
        "async: k2 vs k0: tokens/s 150.0 vs 100.0 (x1.50), step_time 1.50s vs 2.00s, "
        "trainer idle 0.10 vs 0.60, reward_mean 0.550 vs 0.500"
    )
