"""MindSpeed-RL's `profiler_config.integrated` in a real actor worker (megatron-core, HF
rollout engine, one process): the stage calls it names are the worker's calls, and each
capture is a Chrome trace of the steps and stages asked for."""

from __future__ import annotations

from pathlib import Path

SCRIPT = Path(__file__).with_name("_actor_profiled.py")
TIMEOUT_S = 300.0


def test_actor_stage_calls_are_captured_as_asked(fresh_process, tiny_model_dir, tmp_path):
    out = fresh_process(SCRIPT, {"out": str(tmp_path)}, timeout_s=TIMEOUT_S)
    # listed stages, window [2, 3): one capture per listed call of step 2, nothing else
    assert out["listed"] == {
        "actor_update": [["actor_rank0_step2", ["actor_update"]]],
        "reference_compute_log_prob": [["actor_rank0_step2", ["reference_compute_log_prob"]]],
    }
    # stage all over steps 1-2, the run ending after step 1: its calls, written at the end
    assert out["all"] == {
        "integrated": [
            [
                "actor_rank0_steps1-2",
                sorted(
                    [
                        "actor_compute_log_prob",
                        "actor_generate",
                        "actor_update",
                        "reference_compute_log_prob",
                    ]
                ),
            ]
        ]
    }
    assert out["finished"] == [
        [
            str(tmp_path / "listed" / "actor_update"),
            str(tmp_path / "listed" / "reference_compute_log_prob"),
        ],
        [str(tmp_path / "all" / "integrated")],
    ]
