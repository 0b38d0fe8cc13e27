"""tools/bench/packing.py's bookkeeping: the packed run's keys (valid for the SmolLM2 config),
the padding and step-1 readings from metrics.jsonl, and the summary (no training run)."""

from __future__ import annotations

import json

from tools.bench import packing


def _write_metrics(out_dir, rows) -> None:
    out_dir.mkdir(parents=True)
    (out_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_the_packed_run_differs_by_the_packing_keys_and_they_validate():
    from mindrl.config import load_run_config
    from mindrl.data.packing import PackingSettings, pass_packing

    extra = packing.packing_overrides(2048, 1024)
    run, _ = load_run_config("grpo_smollm2_cpu", [*packing.PADDED, *extra], check_paths=False)
    cfg = run.rl.micro_batching
    assert pass_packing(cfg, "ref") == PackingSettings(True, True, 2048, None)
    assert pass_packing(cfg, "update") == PackingSettings(True, True, 1024, None)


def test_padding_and_step_one_are_read_per_training_step(tmp_path):
    rows = [
        {
            "step": 1,
            "timing/step": 9.0,
            "actor/pg_loss": 0.5,
            "actor/kl_loss": 0.1,
            "actor/entropy": 2.0,
            "grad_norm": 1.0,
            "grpo/score": 0.25,
            "perf/padding_fraction_ref": 0.2,
            "perf/padding_fraction_actor_update": 0.1,
        },
        {"step": 1, "val/score": 0.3},  # a validation line of the same step merges in
        {
            "step": 2,
            "timing/step": 8.0,
            "perf/padding_fraction_ref": 0.4,
            "perf/padding_fraction_actor_update": 0.3,
        },
    ]
    _write_metrics(tmp_path / "run", rows)
    got = packing.padding_and_step1(tmp_path / "run")
    assert got["padding_fraction"] == {"ref": 0.30000000000000004, "actor_update": 0.2}
    assert got["step1"]["actor/pg_loss"] == 0.5 and got["step1"]["grpo/score"] == 0.25


def test_summary_names_times_padding_memory_and_the_step_one_gap():
    def run(s_per_step, update, ref, pad, loss):
        return {
            "summary": {
                "s_per_step": s_per_step,
                "phase_s": {"update": update, "ref": ref},
                "peak_pss_gib": 10.0,
            },
            "padding_fraction": {"actor_update": pad},
            "step1": {k: loss for k in packing.STEP1_KEYS},
        }

    results = {
        "padded": run(100.0, 60.0, 20.0, 0.2, 1.0),
        "packed": run(80.0, 45.0, 15.0, 0.0, 1.0 + 2e-7),
    }
    line = packing.summary_line(results)
    assert line.startswith("packing: step_time padded=100.0s packed=80.0s (x0.80)")
    assert "update 60.0s->45.0s ref 20.0s->15.0s" in line
    assert "padding padded=0.20 packed=0.00" in line
    assert "step1_max_gap=2.00e-07" in line
    assert "shared=" not in line
    results["shared"] = run(60.0, 30.0, 9.0, 0.0, 1.0 - 3e-7)
    line = packing.summary_line(results)
    assert "| shared=60.0s (x0.60) update 30.0s ref 9.0s" in line
    assert "step1_max_gap_shared=3.00e-07" in line
