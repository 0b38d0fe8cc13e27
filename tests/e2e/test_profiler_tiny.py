"""MindSpeed-RL's `profiler_config.integrated` in a real run (`grpo_tiny_cpu` as shipped: Ray,
the actor with its vLLM engine, the reference in a worker of its own): the driver tells the
workers the steps, and each profiled worker writes a Chrome trace of the window's calls."""

from __future__ import annotations

import json

import pytest

from tests.e2e._run import read_metrics, run_train

P = "+profiler_config.integrated."
STAGES = {"actor_generate", "actor_compute_log_prob", "reference_compute_log_prob", "actor_update"}


def _ranges(trace) -> set[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return {e["name"] for e in events if e.get("name") in STAGES and e.get("ph") == "X"}


@pytest.mark.vllm
def test_stage_all_traces_every_profiled_worker_over_the_window(tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "run"
    proc = run_train(
        out,
        "megatron_training.train_iters=3",
        "megatron_training.save_interval=0",
        "actor_config.save=null",
        f"{P}profile=true",
        f"{P}profile_step_start=2",
        f"{P}profile_step_end=3",
        f"{P}profile_analysis=true",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(read_metrics(out)) == 3
    folder = out / "profiler_data" / "integrated"
    assert f"profiler: traces in {folder}" in proc.stdout + proc.stderr
    (actor,) = folder.glob("actor_rank0_steps2-2.*.pt.trace.json")
    (ref,) = folder.glob("ref_rank0_steps2-2.*.pt.trace.json")
    assert _ranges(actor) == {"actor_generate", "actor_compute_log_prob", "actor_update"}
    assert _ranges(ref) == {"reference_compute_log_prob"}
    assert "aten::mm" in (folder / "actor_rank0_steps2-2.ops.txt").read_text()
    assert len(list(folder.iterdir())) == 4  # two traces, two tables: step 2 only
