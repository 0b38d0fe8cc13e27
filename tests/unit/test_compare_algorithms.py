"""tools/compare_algorithms.py's bookkeeping: each algorithm's command and config compose
into a valid run with held-out validation, and the metrics it reads (no training run)."""

from __future__ import annotations

import json

import pytest

from tools import compare_algorithms as compare
from tools.bench import training_run


@pytest.mark.parametrize("name", sorted(compare.ALGORITHMS))
def test_each_algorithm_is_its_shipped_config_with_validation(name, tmp_path):
    from mindrl.config import load_run_config

    algo = compare.ALGORITHMS[name]
    overrides = training_run.common_overrides(40, tmp_path / name) + compare.validation_overrides(
        10
    )
    run = load_run_config(algo.config, overrides, check_paths=False)[0]
    loop = run.rl.loop
    assert loop.val_before_train and loop.test_freq == 10
    assert loop.val_data_path and "smollm2-prompts-val" in loop.val_data_path
    assert run.actor.data.seed == 1234 and run.actor.optim.train_iters == 40
    stage = {"grpo": "ray_grpo", "dapo": "ray_dapo", "gspo": "ray_grpo"}[name]
    assert run.actor.data.stage == stage
    assert algo.script == {"ray_grpo": "cli/train_grpo.py", "ray_dapo": "cli/train_dapo.py"}[stage]
    assert (run.rl.algorithm.policy_loss == "gspo") == (name == "gspo")
    assert run.filters_groups == (name == "dapo")
    cmd = training_run.train_command(algo.config, overrides, algo.script)
    assert cmd[1:4] == [algo.script, "--config-name", algo.config]


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_describe_run_reads_the_held_out_curve_and_training_windows(tmp_path):
    records = [{"step": 0, compare.HELD_OUT_METRIC: 0.03125, "val/score": -0.3}]
    for step in range(1, 5):
        records.append(
            {
                "step": step,
                "timing/step": 10.0 + step,
                compare.TRAIN_METRIC: 0.1 * step,
                "grpo/score": -1.0,
                "response_length/mean": 40.0 - step,
                "train/num_gen_batches": 1.0 + (step == 1),
            }
        )
        if step % 2 == 0:
            records.append({"step": step, compare.HELD_OUT_METRIC: 0.05 * step})
    _write(tmp_path / "metrics.jsonl", records)

    out = compare.describe_run(compare.read_records(tmp_path / "metrics.jsonl"), 2, 99.0)
    assert out["held_out"] == {0: 0.03125, 2: 0.1, 4: 0.2}
    assert out["held_out_before"] == 0.03125 and out["held_out_after"] == 0.2
    assert out["train_reward_windows"] == [0.15, 0.35]
    assert out["response_length_windows"] == [38.5, 36.5]
    assert out["gen_batches"] == [2.0, 1.0, 1.0, 1.0]
    assert out["steps_run"] == 4 and out["s_per_step"] == pytest.approx(12.5)
    assert out["wall_s"] == 99.0

    line = compare.summary_line({"grpo": out, "dapo": {"error": "boom"}})
    assert line == "algorithms: held_out grpo=0.031->0.200 dapo=failed"


def test_a_run_without_a_validation_after_training_has_no_after_score():
    out = compare.describe_run({0: {"step": 0, compare.HELD_OUT_METRIC: 0.5}}, 10, 1.0)
    assert out["held_out_before"] == 0.5 and out["held_out_after"] is None
    assert out["steps_run"] == 0 and out["s_per_step"] is None


def test_steps_must_end_on_a_validation():
    with pytest.raises(SystemExit):
        compare.main(["--steps", "15", "--val-every", "10"])
    with pytest.raises(SystemExit):
        compare.main(["--algorithms", "grpo,ppo2"])


def test_the_summary_names_a_missing_score():
    run = compare.describe_run({0: {"step": 0, compare.HELD_OUT_METRIC: 0.5}}, 10, 1.0)
    assert compare.summary_line({"gspo": run}) == "algorithms: held_out gspo=0.500->?"


def test_a_reused_run_is_cut_at_the_steps_asked_for(tmp_path):
    records = [{"step": 0, compare.HELD_OUT_METRIC: 0.1, "time": 100.0}]
    for step in range(1, 7):
        records.append(
            {"step": step, "timing/step": 2.0, compare.TRAIN_METRIC: 0.5, "time": 100.0 + step}
        )
        if step % 2 == 0:
            records.append({"step": step, compare.HELD_OUT_METRIC: step / 8, "time": 100.5 + step})
    _write(tmp_path / "metrics.jsonl", records)

    out = compare.reuse_run(tmp_path, 4, 2)
    assert out["reused"] == str(tmp_path)
    assert out["held_out"] == {0: 0.1, 2: 0.25, 4: 0.5} and out["steps_run"] == 4
    assert out["wall_s"] == pytest.approx(4.5)  # the records' span up to step 4
    with pytest.raises(SystemExit, match="no validation at step 5"):
        compare.reuse_run(tmp_path, 5, 5)
    with pytest.raises(SystemExit):
        compare.main(["--reuse", "grpo", "--steps", "4", "--val-every", "2"])
