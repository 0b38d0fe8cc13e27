"""Run by test_actor_worker.py in a fresh process: an ActorWorker (world of one, real
megatron-core, HF rollout engine) takes a NaN batch, then a finite one. Prints JSON."""

import json
import math

import torch


def main() -> None:
    from mindrl.algorithms import compute_advantages
    from mindrl.config import load_run_config
    from mindrl.data.dataset import PromptDataset
    from mindrl.rollout import RolloutSampling
    from mindrl.trainer.batch import build_sample_batch
    from mindrl.workers.actor import ActorWorker

    run, _ = load_run_config("grpo_tiny_cpu", ["generate_config.rollout_backend=hf"])
    worker = ActorWorker(run)
    worker.init_model()
    worker.sync_weights()
    ds = PromptDataset(run.actor.data.data_path)
    prompts = [list(ds[i].prompt_ids) for i in range(8)]
    rows = worker.generate(prompts, RolloutSampling(n=8, max_tokens=8, seed=3))
    batch = build_sample_batch(
        [prompts[r["prompt_index"]] for r in rows],
        [r["token_ids"] for r in rows],
        0,
        rollout_log_probs=[r["log_probs"] for r in rows],
    )
    old = worker.compute_log_prob(batch)
    mismatch = float(((old - batch.tensors["rollout_log_probs"]).abs() * batch.response_mask).max())
    adv = compute_advantages("group_norm", torch.rand(batch.size), 8, batch.response_mask)
    params = lambda: [p.detach().clone() for p in worker.model_chunks[0].parameters()]  # noqa: E731
    before = params()
    bad = batch.with_tensors(old_log_probs=old, advantages=adv * float("nan"), ref_log_probs=old)
    m_bad = worker.update(bad, 0)
    after_bad = params()
    good = batch.with_tensors(old_log_probs=old, advantages=adv, ref_log_probs=old)
    m_good = worker.update(good, 1)
    after_good = params()
    print(
        json.dumps(
            {
                "mismatch": mismatch,
                "skipped_after_bad": m_bad["actor/skipped_updates"],
                "bad_grad_norm_nan": math.isnan(m_bad["grad_norm"]),
                "unchanged_after_bad": all(torch.equal(a, b) for a, b in zip(before, after_bad)),
                "skipped_after_good": m_good["actor/skipped_updates"],
                "changed_after_good": any(
                    not torch.equal(a, b) for a, b in zip(after_bad, after_good)
                ),
                "good_grad_norm": m_good["grad_norm"],
            }
        )
    )
    worker.shutdown()


if __name__ == "__main__":
    main()
