"""tools/bench/e2e.py's bookkeeping (steady-state summary, ratios) and process_tree.py's peak
memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench import e2e, process_tree


def test_summary_skips_the_warm_up_step():
    run = {
        "peak_pss_gib": 1.0,
        "steps": [
            {"step_time": 100.0, "tokens": 1000, "reward": 0.1, "phases": {"update": 90.0}},
            {"step_time": 10.0, "tokens": 1000, "reward": 0.2, "phases": {"update": 6.0}},
            {"step_time": 30.0, "tokens": 3000, "reward": 0.3, "phases": {"update": 10.0}},
        ],
    }
    s = e2e.summarize(run)
    assert s["s_per_step"] == pytest.approx(20.0)
    assert s["tok_per_s"] == pytest.approx(100.0)  # 4000 tokens / 40 s
    assert s["phase_s"] == {"update": 8.0}
    assert s["rewards"] == [0.1, 0.2, 0.3] and s["reward_mean"] == pytest.approx(0.2)


def test_tree_memory_counts_children_and_failures_name_the_log(tmp_path):
    # a child holding ~300 MB: the tree's peak must include it
    code = (
        "import subprocess, sys; subprocess.run([sys.executable, '-c', "
        "\"import time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
        'time.sleep(2)"], check=True)'
    )
    peak = process_tree.run_tree([sys.executable, "-c", code], tmp_path / "ok.log", timeout_s=60)
    assert peak.gib > 0.25
    # where the peak is: the parent and its child, largest first, adding up to the peak
    assert len(peak.by_process) == 2
    shares = list(peak.by_process.values())
    assert shares[0] > 0.25 and shares == sorted(shares, reverse=True)
    assert abs(sum(shares) - peak.gib) < 0.01
    with pytest.raises(SystemExit, match="exit code 3"):
        process_tree.run_tree(
            [sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
            tmp_path / "bad.log",
            timeout_s=60,
        )


def test_gated_tree_memory_reads_pss_only_as_the_tree_grows():
    # 100 MB, then 200 MB more, then 3 s steady: the peak is still read, the steady polls
    # read only each process's statm
    code = (
        "import time; a = bytearray(100 * 2**20); a[::4096] = b'x' * len(a[::4096]); "
        "time.sleep(1); b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
        "time.sleep(3)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    memory = process_tree.TreeMemory(proc.pid, interval_s=0.25, pss_gate_mib=32)
    assert proc.wait(timeout=60) == 0
    peak = memory.stop()
    assert peak.gib > 0.28
    assert memory.pss_readings >= 2  # the start and the growth
    assert memory.polls - memory.pss_readings >= 8  # the 3 steady seconds read no PSS


def test_ratios_compare_equal_precisions_and_fastest_is_measured():
    def run(tok_per_s: float) -> dict:
        return {"summary": {"tok_per_s": tok_per_s}}

    results = {
        "mindrl_fp32": run(120.0),
        "trl_fp32": run(60.0),
        "mindrl_bf16": run(150.0),
        "trl_bf16": run(50.0),
        "trl_bf16_mixed": run(30.0),
    }
    assert e2e.precision_ratios(results) == {
        "fp32": pytest.approx(2.0),
        "bf16": pytest.approx(3.0),
        "bf16_mixed": pytest.approx(5.0),  # mindrl_bf16 against TRL's mixed-precision run
    }
    assert e2e.fastest_mindrl(results) == "mindrl_bf16"
    # TRL skipped: no ratio at all; a precision only one stack ran at: no ratio for it
    assert e2e.precision_ratios({"mindrl_fp32": run(1.0)}) == {}
    without_bf16 = {**results, "trl_bf16": None, "trl_bf16_mixed": None}
    assert e2e.precision_ratios(without_bf16) == {"fp32": pytest.approx(2.0)}
    assert e2e.fastest_mindrl({"mindrl_fp32": run(1.0), "trl_fp32": run(9.0)}) == "mindrl_fp32"


def test_overlapped_log_prob_passes_count_once_in_the_phase_split():
    step = {"timing/rollout": 1.0, "timing/ref": 0.4, "timing/old_log_prob": 0.3}
    assert e2e.mindrl_phases(step)["ref"] == 0.4  # an older run: the passes one after the other
    phases = e2e.mindrl_phases({**step, "timing/log_probs": 0.45, "timing/update": 2.0})
    assert "ref" not in phases and "old_log_prob" not in phases
    assert phases["log_probs"] == 0.45 and sum(phases.values()) == pytest.approx(3.45)


def test_memory_ratio_is_fastest_against_fastest():
    def res(tok_per_s: float, peak: float) -> dict:
        return {"summary": {"tok_per_s": tok_per_s, "peak_pss_gib": peak}}

    results = {
        "mindrl_fp32": res(100.0, 6.0),
        "mindrl_bf16": res(50.0, 5.0),
        "trl_fp32": res(40.0, 4.0),
        "trl_bf16": res(60.0, 3.0),
    }
    assert e2e.memory_ratio(results) == pytest.approx(2.0)  # 6.0 (fp32) / 3.0 (bf16)
    assert e2e.memory_ratio({"mindrl_fp32": res(1.0, 1.0)}) is None


@pytest.mark.parametrize(
    ("overrides", "checkpoints"),
    [
        ((), False),
        (
            (
                "actor_config.recompute_granularity=full",
                "actor_config.recompute_method=uniform",
                "actor_config.recompute_num_layers=1",
            ),
            True,
        ),
        (("actor_config.recompute_granularity=selective",), False),
    ],
)
def test_trl_checkpoints_activations_exactly_when_mindrl_recomputes_layers(overrides, checkpoints):
    from mindrl.config import load_run_config
    from tools.bench.trl_grpo import recomputes_layers

    run = load_run_config("grpo_smollm2_cpu", list(overrides), check_paths=False)[0]
    assert recomputes_layers(run) is checkpoints


def test_trl_run_gets_the_mindrl_overrides(tmp_path, monkeypatch):
    seen = []

    def fake_tree(cmd, log, timeout_s):
        seen.append(cmd)
        out = cmd[cmd.index("--out") + 1]
        with open(out, "w") as f:
            f.write('{"steps": []}')
        return process_tree.MemoryPeak(1.0)

    monkeypatch.setattr(e2e, "run_tree", fake_tree)
    overrides = ("~ref_config", "actor_config.recompute_granularity=full")
    e2e.run_trl("trl_fp32", "grpo_smollm2_cpu", 3, "fp32", tmp_path, overrides)
    cmd = seen[0]
    assert cmd[cmd.index("--") + 1 :] == list(overrides)


def test_fastest_ratio_pairs_each_stacks_fastest_run_whatever_its_precision():
    def run(tok_per_s: float) -> dict:
        return {"summary": {"tok_per_s": tok_per_s}}

    results = {
        "mindrl_fp32": run(100.0),
        "mindrl_bf16": run(240.0),
        "trl_fp32": run(40.0),
        "trl_bf16": run(80.0),
        "trl_bf16_mixed": run(60.0),
    }
    assert e2e.fastest_pair(results) == ("mindrl_bf16", "trl_bf16")
    assert e2e.fastest_ratio(results) == pytest.approx(3.0)
    # fp32 the faster for TRL (a CPU without bf16 hardware): mindrl's bf16 against it
    slow_bf16 = {**results, "trl_bf16": run(20.0), "trl_bf16_mixed": run(10.0)}
    assert e2e.fastest_pair(slow_bf16) == ("mindrl_bf16", "trl_fp32")
    assert e2e.fastest_ratio(slow_bf16) == pytest.approx(6.0)
    assert e2e.fastest_ratio({"mindrl_fp32": run(1.0)}) is None
    assert e2e.fastest_pair({"trl_fp32": run(1.0)}) is None


def test_runs_are_as_shipped_unless_overridden_and_the_plan_follows_the_shipped_precision():
    # the config's own precision needs no pin; the other precision (--bf16) is pinned
    assert e2e.mindrl_overrides("bf16", "bf16") == ()
    assert e2e.mindrl_overrides("fp32", "bf16") == e2e.PRECISION_OVERRIDES["fp32"]
    assert e2e.mindrl_overrides("fp32", "fp32", ("a.b=1",)) == ("a.b=1",)
    assert e2e.overrides_line("mindrl_bf16", "grpo_smollm2_cpu", []) == (
        "mindrl_bf16: grpo_smollm2_cpu as shipped (no overrides)"
    )
    assert e2e.overrides_line("trl_fp32", "c", ["a.b=1", "~x"]) == (
        "trl_fp32: c with overrides (not as shipped): a.b=1 ~x"
    )
    assert e2e.run_plan("bf16", False, False) == [("mindrl", "bf16"), ("trl", "bf16")]
    assert e2e.run_plan("fp32", False, True) == [("mindrl", "fp32")]
    assert e2e.run_plan("fp32", True, False) == [
        ("mindrl", "fp32"),
        ("trl", "fp32"),
        ("mindrl", "bf16"),
        ("trl", "bf16"),
        ("trl", "bf16_mixed"),
    ]


def _fake_runs(tmp_path, monkeypatch) -> list[list[str]]:
    """Both stacks' processes replaced by writers of their outputs: one row per step."""
    import json

    seen: list[list[str]] = []

    def fake_tree(cmd, log, timeout_s):
        seen.append(cmd)
        if "cli/train_grpo.py" in cmd:
            out = next(a.split("=", 1)[1] for a in cmd if a.startswith("runtime.output_dir="))
            rows = [
                {"step": s, "timing/step": 10.0, "e2e_tps": 100.0, "grpo/score": 0.1}
                for s in (1, 2)
            ]
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        else:
            out = cmd[cmd.index("--out") + 1]
            step = {"step_time": 30.0, "tokens": 1000.0, "reward": 0.1, "phases": {}}
            with open(out, "w") as f:
                json.dump({"steps": [step, step]}, f)
        return process_tree.MemoryPeak(1.0)

    monkeypatch.setattr(e2e, "run_tree", fake_tree)
    monkeypatch.setattr(e2e, "run_roofline", lambda *a: {})
    monkeypatch.setattr(e2e, "roofline_line", lambda name, roofline: f"{name}: roofline")
    monkeypatch.setattr("tools.bench.roofline.matmul_gflops", lambda precision: 1.0)
    return seen


def test_the_report_prints_and_records_each_runs_overrides(tmp_path, monkeypatch, capsys):
    import json

    seen = _fake_runs(tmp_path, monkeypatch)
    shipped = e2e.shipped_precision("grpo_smollm2_cpu")  # this machine's choice
    out = tmp_path / "e2e.json"
    assert e2e.main(["--steps", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    mindrl_cmd = seen[0]
    assert mindrl_cmd[1:4] == ["cli/train_grpo.py", "--config-name", "grpo_smollm2_cpu"]
    assert not any(a.startswith(("megatron_training.bf16", "generate_config.")) for a in mindrl_cmd)
    assert f"mindrl_{shipped}: grpo_smollm2_cpu as shipped (no overrides)" in printed
    assert f"trl_{shipped}: grpo_smollm2_cpu as shipped (no overrides)" in printed
    report = json.loads(out.read_text())
    assert report["as_shipped"] == {f"mindrl_{shipped}": True, f"trl_{shipped}": True}
    assert report["shipped_precision"] == shipped and report["mindrl_overrides"] == []

    # an override is the exception: printed for both stacks and recorded
    seen.clear()
    extra = "actor_config.recompute_granularity=selective"
    assert e2e.main(["--steps", "2", "--out", str(out), "--mindrl-override", extra]) == 0
    printed = capsys.readouterr().out
    assert f"mindrl_{shipped}: grpo_smollm2_cpu with overrides (not as shipped): {extra}" in printed
    assert f"trl_{shipped}: grpo_smollm2_cpu with overrides (not as shipped): {extra}" in printed
    report = json.loads(out.read_text())
    assert report["as_shipped"] == {f"mindrl_{shipped}": False, f"trl_{shipped}": False}
    assert report["runs"][f"mindrl_{shipped}"]["overrides"] == [extra]
    assert seen[0][-1] == extra and seen[1][-1] == extra


def test_a_failed_trl_run_keeps_mindrls_result_and_exits_1(tmp_path, monkeypatch, capsys):
    import json

    _fake_runs(tmp_path, monkeypatch)
    mindrl_tree = e2e.run_tree

    def trl_missing(cmd, log, timeout_s):
        if "cli/train_grpo.py" in cmd:
            return mindrl_tree(cmd, log, timeout_s)
        raise SystemExit("trl_grpo.py failed: ModuleNotFoundError: No module named 'trl'")

    monkeypatch.setattr(e2e, "run_tree", trl_missing)
    out = tmp_path / "e2e.json"
    assert e2e.main(["--steps", "2", "--out", str(out)]) == 1
    shipped = e2e.shipped_precision("grpo_smollm2_cpu")
    report = json.loads(out.read_text())
    assert list(report["runs"]) == [f"mindrl_{shipped}"]
    assert "No module named 'trl'" in report["failed_runs"][f"trl_{shipped}"]
    assert report["fastest_ratio"] is None
    assert f"e2e: ratio=n/a (TRL failed: trl_{shipped})" in capsys.readouterr().out
