"""Shared by the actor worker scripts: an ActorWorker (world of one, real megatron-core, HF
rollout engine) on grpo_tiny_cpu and one batch it sampled (8 prompts x 8 samples)."""

from typing import Any


def actor_and_sampled_batch(overrides: list[str]) -> tuple[Any, Any, Any]:
    """(run config, initialised worker with its engine in sync, SampleBatch with the
    engine's log-probs as `rollout_log_probs`)."""
    from mindrl.config import load_run_config
    from mindrl.data.batch import build_sample_batch
    from mindrl.data.dataset import PromptDataset
    from mindrl.rollout import RolloutSampling
    from mindrl.workers.actor import ActorWorker

    run, _ = load_run_config("grpo_tiny_cpu", ["generate_config.rollout_backend=hf", *overrides])
    worker = ActorWorker(run)
    worker.init_model()
    worker.sync_weights()
    ds = PromptDataset(run.actor.data.data_path)
    prompts = [list(ds[i].prompt_ids) for i in range(8)]
    rows = worker.generate(prompts, RolloutSampling(n=8, max_tokens=8, seed=3))
    batch = build_sample_batch(
        [prompts[r.prompt_index] for r in rows],
        [r.token_ids for r in rows],
        0,
        rollout_log_probs=[r.log_probs for r in rows],
    )
    return run, worker, batch
