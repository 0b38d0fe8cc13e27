"""tools/bench/tiny_step.py's bookkeeping: the lean run's keys (valid for the tiny config),
the medians read from metrics.jsonl, and the summary (no training run)."""

from __future__ import annotations

import json

import pytest

from tools.bench import tiny_step


def test_the_shipped_run_is_fast_and_lean_adds_only_the_reference_in_the_actor():
    from mindrl.config import load_run_config
    from mindrl.data.packing import pass_packing

    # grpo_tiny_cpu ships the fast settings: packed, shared prompts, old log-probs in the
    # update, vLLM's compiled mode
    shipped, _ = load_run_config(tiny_step.CONFIG, [], check_paths=False)
    update = pass_packing(shipped.rl.micro_batching, "update")
    assert update.remove_padding and update.share_prompts and update.max_tokens == 8192
    assert shipped.rl.algorithm.recompute_old_log_prob == "in_update"
    assert not shipped.generate.enforce_eager  # vLLM's compiled mode: start-up paid once
    assert not shipped.reference_snapshot and shipped.ref is not None  # a reference worker
    # the lean run: the reference as the actor's weights, no process of its own
    run, _ = load_run_config(tiny_step.CONFIG, tiny_step.LEAN, check_paths=False)
    assert run.reference_snapshot and run.ref is not None
    assert pass_packing(run.rl.micro_batching, "update") == update
    with_hf, _ = load_run_config(tiny_step.CONFIG, tiny_step.LEAN_HF, check_paths=False)
    assert with_hf.generate.rollout_backend == "hf"
    assert pass_packing(with_hf.rl.micro_batching, "update") == update  # only the backend


def _write(out_dir, steps: list[float], phase: float = 0.1) -> None:
    rows = []
    clock = 1000.0
    for i, step_s in enumerate(steps):
        clock += step_s + 0.02  # the driver's logging after each step
        row = {"step": i + 1, "time": clock, "timing/step": step_s, "grpo/score": i / 10}
        row.update({f"timing/{p}": phase for p in tiny_step.PHASES})
        rows.append(row)
    rows.append({"step": 2, "val/score": 0.5})  # a validation line merges into its step
    out_dir.mkdir(parents=True)
    (out_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_medians_leave_out_the_warmup_steps(tmp_path):
    _write(tmp_path / "run", [5.0, 3.0, 0.4, 0.5, 0.3, 0.45])
    got = tiny_step.step_medians(tmp_path / "run", warmup=2)
    assert got["steps_measured"] == 4
    assert got["median_step_s"] == pytest.approx(0.425)
    # wall between rows 3..6: each step's time plus 0.02 s of logging
    assert got["median_wall_s"] == pytest.approx(0.47)
    assert got["median_phase_s"] == {p: 0.1 for p in tiny_step.PHASES}
    assert got["score_first"] == 0.0 and got["score_last"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="fewer than warmup 5"):
        tiny_step.step_medians(tmp_path / "run", warmup=5)


def test_summary_gives_both_runs_their_ratio_and_the_target():
    def run(step_s: float, wall_s: float) -> dict:
        return {"median_step_s": step_s, "median_wall_s": wall_s}

    line = tiny_step.summary_line({"shipped": run(0.5, 0.52), "lean": run(0.36, 0.38)})
    assert line == (
        "tiny_step: shipped=0.500s lean=0.360s (x0.72) wall shipped=0.520s lean=0.380s "
        "target<=0.25s below"
    )
    assert tiny_step.summary_line({"shipped": run(0.5, 0.5), "lean": run(0.2, 0.2)}).endswith("ok")
    # the host's matmul rate that day, before / after the runs, closes the line
    runs = {"shipped": run(0.5, 0.5), "lean": run(0.2, 0.2)}
    assert tiny_step.summary_line(runs, (97.6, 88.2)).endswith(
        "target<=0.25s ok (host fp32 matmul 98 / 88 GFLOP/s before / after)"
    )
    # a failed HF run leaves the line as it was; a measured one sits beside the lean run
    assert tiny_step.summary_line({**runs, "lean_hf": {"error": "timeout"}}) == (
        tiny_step.summary_line(runs)
    )
    assert "lean=0.200s (x0.40) lean_hf=0.180s wall" in tiny_step.summary_line(
        {**runs, "lean_hf": run(0.18, 0.19)}
    )


def _measured(step_s: float, wall_s: float, rollout_s: float, peak: float) -> dict:
    return {
        "median_step_s": step_s,
        "median_wall_s": wall_s,
        "median_phase_s": {"rollout": rollout_s, "update": 0.1},
        "summary": {"peak_pss_gib": peak},
    }


def test_rounds_combine_into_medians_with_their_range():
    rounds = [
        {"shipped": _measured(0.5, 0.52, 0.2, 1.9), "lean": _measured(0.33, 0.34, 0.15, 1.6)},
        {"shipped": _measured(0.8, 0.81, 0.3, 1.8), "lean": _measured(0.23, 0.24, 0.11, 1.5)},
        {"shipped": _measured(0.54, 0.55, 0.19, 2.0), "lean": _measured(0.25, 0.27, 0.12, 1.7)},
    ]
    got = tiny_step.combine_rounds(rounds)
    lean = got["lean"]
    assert lean["median_step_s"] == 0.25 and lean["round_step_s"] == [0.33, 0.23, 0.25]
    assert lean["median_wall_s"] == 0.27
    assert lean["median_phase_s"] == {"rollout": 0.12, "update": 0.1}
    assert lean["summary"]["peak_pss_gib"] == 1.7  # the middle round's own record
    assert got["shipped"]["median_step_s"] == 0.54 and got["shipped"]["summary"] == {
        "peak_pss_gib": 2.0
    }
    line = tiny_step.summary_line(got)
    assert line.startswith(
        "tiny_step: shipped=0.540s [0.500-0.800] lean=0.250s [0.230-0.330] (x0.46) "
    )
    assert line.endswith("target<=0.25s ok")
    # an even count: the step is the mean of the middle two, the record the lower one's
    two = tiny_step.combine_rounds(rounds[:2])["lean"]
    assert two["median_step_s"] == pytest.approx(0.28) and two["summary"]["peak_pss_gib"] == 1.5


def test_a_round_that_failed_is_not_hidden_by_the_others():
    ok = {"shipped": _measured(0.5, 0.5, 0.2, 1.9), "lean": _measured(0.3, 0.3, 0.1, 1.6)}
    failed = {"shipped": _measured(0.6, 0.6, 0.2, 1.9), "lean": {"error": "timed out"}}
    got = tiny_step.combine_rounds([ok, failed])
    assert got["lean"]["error"] == "timed out" and got["lean"]["round_step_s"] == [0.3]
    assert "error" not in got["shipped"]
    assert tiny_step.combine_rounds([failed])["lean"] == {"error": "timed out"}
