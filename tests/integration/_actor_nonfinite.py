"""Run by test_actor_worker.py through the `fresh_process` fixture: an ActorWorker (world of
one, real megatron-core, HF rollout engine) takes a NaN batch, then a finite one.

Arguments: none. Result: the rollout/training log-prob mismatch, the skip counters, the grad
norms and whether the weights moved after each update."""

import math
from typing import Any

import torch

from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    from _actor_setup import actor_and_sampled_batch

    from mindrl.algorithms import compute_advantages

    _, worker, batch = actor_and_sampled_batch([])
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
    result = {
        "mismatch": mismatch,
        "skipped_after_bad": float(m_bad["actor/skipped_updates"]),
        "bad_grad_norm_nan": math.isnan(m_bad["grad_norm"]),
        "unchanged_after_bad": all(torch.equal(a, b) for a, b in zip(before, after_bad)),
        "skipped_after_good": float(m_good["actor/skipped_updates"]),
        "in_a_row_after_bad": float(m_bad["actor/consecutive_skipped_updates"]),
        "in_a_row_after_good": float(m_good["actor/consecutive_skipped_updates"]),
        "changed_after_good": any(not torch.equal(a, b) for a, b in zip(after_bad, after_good)),
        "good_grad_norm": float(m_good["grad_norm"]),
    }
    worker.shutdown()
    return result


if __name__ == "__main__":
    json_main(main)
