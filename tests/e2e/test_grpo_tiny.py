"""End to end: `cli/train_grpo.py --config-name grpo_tiny_cpu` on this CPU, real Ray, real
megatron-core workers, real rollout engine. One 40-step run is shared (module fixture): it
must learn and write its outputs, a run resumed from its step-20 checkpoint must continue it
exactly, and a run with rollout on its own devices must repeat its first steps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e._run import ROOT, checkpoint_of_step, comparable, read_metrics, run_train
from tests.fresh_process import run_process


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory, tiny_model_dir) -> Path:
    out = tmp_path_factory.mktemp("grpo") / "run"
    proc = run_train(out, "rl_config.log_completions=2")  # bounded by TRAIN_TIMEOUT_S
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_tiny_run_learns_and_writes_its_outputs(learned_run):
    out = learned_run
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics] == list(range(1, 41))
    scores = [m["grpo/score"] for m in metrics]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last >= first + 0.3, (first, last)
    for key in (
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/entropy",
        "grad_norm",
        "actor/lr",
        "response_length/mean",
        "prompt_length/mean",
        "digit_share_rewards/mean",
        "timing/rollout",
        "timing/update",
        "e2e_tps",
        "update_tps",
        "vllm_tps",
        "rollout/logprob_abs_diff",
    ):
        assert key in metrics[-1], key
    # the trained and rollout log-probs of the same tokens agree (weights in sync)
    assert max(m["rollout/logprob_abs_diff"] for m in metrics) < 1e-3
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "resolved_config.yaml").is_file()
    assert len((out / "completions.jsonl").read_text().splitlines()) == 2 * 40
    ckpt = out / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "40"
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000020", "iter_0000040"]
    assert (ckpt / "hf_final" / "config.json").is_file()

    png = out / "curves.png"
    plot = run_process(
        [sys.executable, ROOT / "tools" / "plot_metrics.py", out / "metrics.jsonl", "--out", png],
        timeout_s=120,
    )
    assert plot.returncode == 0, plot.stderr
    assert png.stat().st_size > 10_000


def test_resume_continues_exactly(tmp_path, learned_run):
    """From the shared run's step-20 checkpoint (model, optimizer, sampler, RNG) into a new
    folder: steps 21-22 equal the straight run's."""
    step20 = checkpoint_of_step(learned_run / "ckpt", 20, tmp_path / "from20")
    resumed = tmp_path / "resumed"
    proc = run_train(resumed, "actor_config.train_iters=22", f"actor_config.load={step20}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from" in proc.stderr + proc.stdout
    straight, again = read_metrics(learned_run), read_metrics(resumed)
    assert [m["step"] for m in again] == [21, 22]
    assert [comparable(m) for m in again] == [comparable(m) for m in straight[20:22]]


def test_separate_rollout_actor_gives_the_same_run(tmp_path, learned_run):
    separate = tmp_path / "separate"
    proc = run_train(
        separate, "actor_config.train_iters=3", "rl_config.rollout_resource.num_npus=1"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "group rollout: 1 device(s)" in proc.stdout
    a, b = read_metrics(learned_run)[:3], read_metrics(separate)  # the hybrid layout's
    assert len(b) == 3
    for x, y in zip(a, b):
        for key in ("grpo/score", "actor/pg_loss", "actor/kl_loss", "response_length/mean"):
            assert x[key] == pytest.approx(y[key], abs=1e-5), key


def test_tp2_actor_keeps_its_rollout_engines_in_sync(tmp_path, tiny_model_dir):
    """Actor at TP=2 (two processes over gloo), a vLLM/HF engine on each rank at infer TP=1:
    after every optimizer step the engines' log-probs of the tokens they sampled equal the
    TP=2 training model's (the weights were resharded and streamed correctly)."""
    out = tmp_path / "tp2"
    proc = run_train(
        out,
        "actor_config.train_iters=3",
        "rl_config.actor_resource.num_npus=2",
        "actor_config.tensor_model_parallel_size=2",
        "runtime.ray_num_cpus=2",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "actor    devices=2 TP=2 PP=1 DP=1" in proc.stdout
    metrics = read_metrics(out)
    assert len(metrics) == 3
    for m in metrics:  # steps 2 and 3 run on weights synced after an update
        assert m["rollout/logprob_abs_diff_max"] <= 1e-4, m["rollout/logprob_abs_diff_max"]
        assert m["resharding/bytes"] > 0
