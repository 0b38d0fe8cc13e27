"""tools/bench/async.py's bookkeeping: the two runs' keys (valid for the tiny config), the
pipeline metrics read from metrics.jsonl, the cluster model and the summary (no run)."""

from __future__ import annotations

import importlib
import json

import pytest

bench = importlib.import_module("tools.bench.async")  # `async` is a keyword


def test_both_runs_put_rollout_on_its_own_devices_and_differ_by_staleness():
    from mindrl.config import load_run_config

    for staleness in (0, 1):
        run, _ = load_run_config("grpo_tiny_cpu", bench.variant_overrides(staleness))
        assert run.rl.resources.rollout_resource.num_npus == 1
        assert run.rl.resources.rollout_staleness == staleness


def test_pipeline_metrics_are_averaged_over_steps_two_to_n(tmp_path):
    rows = [
        {"step": 1, "timing/step": 5.0, "rollout/staleness": 0.0},
        {"step": 2, "timing/step": 2.0, "rollout/staleness": 1.0, "timing/overlap": 0.5},
        {"step": 3, "timing/step": 2.0, "rollout/staleness": 1.0, "timing/overlap": 0.7},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    got = bench.pipeline_means(tmp_path)
    assert got["rollout/staleness"] == 1.0
    assert got["timing/overlap"] == pytest.approx(0.6)


def test_the_cluster_model_hides_the_shorter_of_rollout_and_training():
    assert bench.expected_speedup(0.7, 0.28, 0.02) == pytest.approx(1.0 / 0.72)
    assert bench.expected_speedup(0.5, 0.5, 0.0) == pytest.approx(2.0)
    assert bench.expected_speedup(1.0, 0.0, 0.0) == pytest.approx(1.0)


def test_summary_line():
    results = {
        "sync": {"summary": {"s_per_step": 2.0}},
        "one_off": {
            "summary": {"s_per_step": 1.5},
            "pipeline": {
                "rollout/staleness": 1.0,
                "timing/overlap": 0.8,
                "timing/rollout_wait": 0.1,
            },
        },
    }
    line = bench.summary_line(results)
    assert line == (
        "async: step_time sync=2.00s one_off=1.50s (x0.75) staleness=1.00 overlap=0.80 wait=0.10s"
    )
