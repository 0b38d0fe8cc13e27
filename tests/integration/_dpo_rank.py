"""One rank of a DPO run on megatron-core over gloo (tests/integration/test_dpo_update.py): an
ActorWorker (no rollout engine) on `dpo_tiny_cpu` with the test's overrides, trained on the
toy pairs: each step the reference's log-probs of the batch (the weight snapshot in this
process), then one DPO update; held-out preference accuracy before and after.

Arguments: {"overrides": [...], "steps": int, "batch": pairs per step}. Result per rank:
{"metrics": per step, "accuracy_before", "accuracy_after"}.
"""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main
from tests.integration._rank_start import rank_run_config


def held_out_accuracy(worker: Any, batch: Any) -> float:
    from mindrl.algorithms.dpo import pair_preference_accuracy

    return pair_preference_accuracy(worker.compute_log_prob(batch, "actor"), batch.response_mask)


def main(args: dict[str, Any]) -> dict[str, Any]:
    run = rank_run_config("dpo_tiny_cpu", args["overrides"])
    from mindrl.assets.pairs import tiny_pairs_dir, tiny_pairs_val_dir
    from mindrl.data.pairs import pair_batch, read_pairs
    from mindrl.workers.actor import ActorWorker

    worker = ActorWorker(run, with_rollout=False)
    worker.init_model()
    pad = 0
    train = read_pairs(tiny_pairs_dir())
    held_out = pair_batch(read_pairs(tiny_pairs_val_dir()), pad)
    before = held_out_accuracy(worker, held_out)
    metrics = []
    size = args["batch"]
    for step in range(args["steps"]):
        start = step * size % len(train)
        batch = pair_batch(train[start : start + size], pad)
        batch = batch.with_tensors(ref_log_probs=worker.compute_ref_log_prob(batch))
        metrics.append(worker.update(batch, step))
    after = held_out_accuracy(worker, held_out)
    worker.shutdown()
    keep = ("rewards/", "logps/", "dpo/", "grad_norm")
    return {
        "metrics": [{k: v for k, v in m.items() if k.startswith(keep)} for m in metrics],
        "accuracy_before": before,
        "accuracy_after": after,
    }


if __name__ == "__main__":
    json_main(main)
