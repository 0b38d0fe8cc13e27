"""Run by test_rollout_correction_update.py through the `fresh_process` fixture: an
ActorWorker (world of one, real megatron-core, HF rollout engine) takes one update with the
rollout correction on, the engine's log-probs shifted per sequence so that some weights
leave the range.

Arguments: {"overrides": [rl_config overrides]}. Result: the update metrics, and the
sequence-level weights of the whole batch computed here (the reference for the reduced
metrics)."""

from typing import Any

import torch

from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    from _actor_setup import actor_and_sampled_batch

    from mindrl.algorithms import compute_advantages

    run, worker, batch = actor_and_sampled_batch(list(args["overrides"]))
    old = worker.compute_log_prob(batch)
    mask = batch.response_mask
    g = torch.Generator().manual_seed(5)
    shift = torch.randn(batch.size, 1, generator=g) * 0.15  # per token of each sequence
    rollout = torch.where(mask.bool(), old + shift, batch.tensors["rollout_log_probs"])
    adv = compute_advantages("group_norm", torch.rand(batch.size), 8, mask)
    batch = batch.with_tensors(
        old_log_probs=old, rollout_log_probs=rollout, advantages=adv, ref_log_probs=old
    )
    metrics = worker.update(batch, 0)
    seq_weights = torch.exp(((old - rollout) * mask).sum(-1))[mask.sum(-1) > 0]
    worker.shutdown()
    return {
        "metrics": {k: float(v) for k, v in metrics.items()},
        "seq_weights": seq_weights.tolist(),
    }


if __name__ == "__main__":
    json_main(main)
