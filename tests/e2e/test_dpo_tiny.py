"""Offline DPO end to end on the tiny model (cli/train_dpo.py, stage dpo: real Ray and
megatron-core): TRL's metrics each step, checkpoints and the HF export, and a run resumed from
its mid-run checkpoint continues exactly (the same pairs, the same losses)."""

from __future__ import annotations

from functools import partial

from tests.e2e._run import ROOT, checkpoint_of_step, comparable, read_metrics
from tests.e2e._run import run_train as _run_train

run_train = partial(_run_train, cli=ROOT / "cli" / "train_dpo.py", config="dpo_tiny_cpu")
SHORT = ("megatron_training.train_iters=4", "megatron_training.save_interval=2")


def test_dpo_tiny_trains_exports_and_resumes_exactly(tmp_path):
    out, resumed = tmp_path / "dpo", tmp_path / "resumed"
    proc = run_train(out, *SHORT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "offline DPO: 4 steps of 16 pairs" in proc.stdout
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[0]["rewards/margins"] == 0.0  # the policy starts as the reference
    assert metrics[-1]["rewards/margins"] > 0 and metrics[-1]["rewards/accuracies"] > 0.5
    assert metrics[-1]["dpo/loss"] < metrics[0]["dpo/loss"]
    assert (out / "ckpt" / "hf_final" / "config.json").is_file()
    assert (out / "ckpt" / "iter_0000002").is_dir() and (out / "ckpt" / "iter_0000004").is_dir()

    step2 = checkpoint_of_step(out / "ckpt", 2, tmp_path / "from2")
    proc = run_train(resumed, *SHORT, f"actor_config.load={step2}", "actor_config.finetune=false")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = read_metrics(resumed)
    assert [m["step"] for m in again] == [3, 4]
    assert [comparable(m) for m in again] == [comparable(m) for m in metrics[2:4]]
