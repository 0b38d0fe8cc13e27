"""One rank of a LoRA actor run (tests/integration/test_lora.py): an ActorWorker (real
megatron-core, no rollout engine) on grpo_lora_tiny_cpu (adapters, `share_backbone`) with rank 4 and the
test's overrides, trained for a few steps on one fixed synthetic batch (data parallel 1).

Arguments: {"hf_dir", "overrides": [...], "steps": int, "save": DIR | null, "resume": DIR |
null, "export": DIR | null (the merged HF export after the steps), "peft": DIR | null (the PEFT
adapter export)}. Result per rank:
{"metrics": per step, "trainable_params", "total_params", "optimizer_params" (elements the
optimizer steps on), "policy": log-probs after the steps, "gaps": max |differences| between
the policy and the shared-backbone reference before / after training}.
"""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main
from tests.integration._rank_start import SMALL_BATCHES, rank_run_config
from tests.integration._scale_rank import synthetic_batch

LORA = [
    "megatron_training.lora_r=4",
    "megatron_training.lora_alpha=8",
    "megatron_training.lora_ckpt_filter=false",
    "actor_config.lr=1e-3",
]


def optimizer_elements(worker: Any) -> int:
    optimizer = worker.opt.optimizer
    return sum(
        p.numel()
        for part in getattr(optimizer, "chained_optimizers", [optimizer])
        for group in part.optimizer.param_groups
        for p in group["params"]
    )


def main(args: dict[str, Any]) -> dict[str, Any]:
    run = rank_run_config(
        "grpo_lora_tiny_cpu",
        [
            f"actor_config.load={args['hf_dir']}",
            *SMALL_BATCHES,
            *LORA,
            *args["overrides"],
        ],
    )
    from mindrl.workers.actor import ActorWorker

    worker = ActorWorker(run, with_rollout=False)
    counts = worker.init_model(resume_dir=args.get("resume"))
    batch = synthetic_batch(run.actor.model.vocab_size)
    base_before = worker.compute_ref_log_prob(batch)
    policy_before = worker.compute_log_prob(batch)
    metrics = [worker.update(batch, step) for step in range(args["steps"])]
    base_after = worker.compute_ref_log_prob(batch)
    policy_after = worker.compute_log_prob(batch)
    if args.get("export"):
        worker.export_hf(args["export"], args["hf_dir"])
    if args.get("peft"):
        worker.export_peft(args["peft"])
    if args.get("save"):
        worker.save_checkpoint(args["save"])

    def gap(a: Any, b: Any) -> float:
        return float((a - b).abs().max())

    out = {
        "metrics": [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in metrics],
        "trainable_params": counts["trainable_params"],
        "total_params": counts["total_params"],
        "optimizer_params": optimizer_elements(worker),
        "policy": policy_after.tolist(),
        "gaps": {
            "policy_vs_base_before": gap(policy_before, base_before),
            "base_before_vs_after": gap(base_before, base_after),
            "policy_vs_base_after": gap(policy_after, base_after),
        },
    }
    worker.shutdown()
    return out


if __name__ == "__main__":
    json_main(main)
