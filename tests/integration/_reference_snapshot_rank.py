"""One rank of an actor holding the reference as a weight snapshot
(tests/integration/test_reference_snapshot.py): an ActorWorker (real megatron-core, no rollout
engine) on grpo_tiny_cpu with the integrated reference, trained on one fixed synthetic batch.

Arguments: {"hf_dir", "overrides": [...], "steps": int, "ref_passes": bool (a reference pass
before every update, as a GRPO step makes), "save": DIR | null, "save_unfused": bool (the checkpoint's Adam
groups say fused=None), "resume": DIR | null}.
Result per rank: {"metrics": per step, "policy": log-probs after the steps, "ref_before" /
"ref_after": the reference's log-probs before the first and after the last update (lists, or
null without a snapshot), "policy_before": the policy's before training, "adam_fused": each
Adam param group's `fused` option}.
"""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main
from tests.integration._rank_start import SMALL_BATCHES, rank_run_config
from tests.integration._scale_rank import synthetic_batch


def main(args: dict[str, Any]) -> dict[str, Any]:
    run = rank_run_config(
        "grpo_tiny_cpu",
        [
            f"actor_config.load={args['hf_dir']}",
            "rl_config.use_integrated_worker=true",
            "~ref_config",
            *SMALL_BATCHES,
            "actor_config.lr=1e-3",
            *args["overrides"],
        ],
    )

    from mindrl.workers.actor import ActorWorker

    worker = ActorWorker(run, with_rollout=False)
    worker.init_model(resume_dir=args.get("resume"))
    batch = synthetic_batch(run.actor.model.vocab_size)
    held = worker.ref_snapshot is not None
    policy_before = worker.compute_log_prob(batch)
    ref_before = worker.compute_ref_log_prob(batch) if held else None
    metrics = []
    for step in range(args["steps"]):
        if args["ref_passes"] and held:
            worker.compute_ref_log_prob(batch)
        metrics.append(worker.update(batch, step))
    ref_after = worker.compute_ref_log_prob(batch) if held else None
    policy = worker.compute_log_prob(batch)
    fused = [g.get("fused") for g in worker.opt.optimizer.optimizer.param_groups]
    if args.get("save"):
        if args.get("save_unfused"):  # a checkpoint as written before Adam was fused
            for group in worker.opt.optimizer.optimizer.param_groups:
                group["fused"] = None
        worker.save_checkpoint(args["save"])

    def listed(t: Any) -> Any:
        return None if t is None else t.tolist()

    return {
        "metrics": [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in metrics],
        "policy_before": listed(policy_before),
        "policy": listed(policy),
        "ref_before": listed(ref_before),
        "ref_after": listed(ref_after),
        "adam_fused": fused,
    }


if __name__ == "__main__":
    json_main(main)
