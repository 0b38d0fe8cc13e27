"""One rank of a packing run (tests/integration/test_packing.py): an ActorWorker (real
megatron-core, no rollout engine) on grpo_tiny_cpu with the test's overrides, on one fixed
synthetic batch of varied lengths: the reference and old-policy log-probs, then a few
updates, each followed by this rank's gradients.

Arguments: {"hf_dir" (null: the config's model), "config" (default grpo_tiny_cpu),
"overrides": [...], "steps": int, "grads": FILE, "grouped": rows share prompts, "old_pass": the
batch carries the old policy's log-probs from their own pass, "hf_weights": FILE (optional):
rank 0 saves the HF-named weights after the steps as the weight sync and the converter read
them (`iter_hf_tensors`)}. Result per rank:
{"ref": log-probs [B, S-1], "actor": log-probs, "metrics": per step, "policy": log-probs
after the steps}; rank 0 saves {step: {param name: gradient}} (its shard) to `grads`.
"""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main
from tests.integration._rank_start import rank_run_config
from tests.integration._scale_rank import synthetic_batch


def gradients(worker: Any) -> dict[str, Any]:
    """This rank's gradient of every trained parameter (megatron DDP's main_grad)."""
    out = {}
    for i, chunk in enumerate(worker.model_chunks):
        for name, p in chunk.named_parameters():
            grad = getattr(p, "main_grad", None)
            if grad is not None:
                out[f"{i}.{name}"] = grad.detach().clone()
    return out


def main(args: dict[str, Any]) -> dict[str, Any]:
    load = [f"actor_config.load={args['hf_dir']}"] if args.get("hf_dir") else []
    run = rank_run_config(
        args.get("config", "grpo_tiny_cpu"),
        [
            *load,
            "actor_config.micro_batch_size=4",
            "rl_config.mini_batch_size=4",
            "actor_config.lr=1e-3",
            *args["overrides"],
        ],
    )
    import torch

    from mindrl.workers.actor import ActorWorker

    worker = ActorWorker(run, with_rollout=False)
    worker.init_model()
    batch = synthetic_batch(run.actor.model.vocab_size, grouped=bool(args.get("grouped")))
    ref = worker.compute_log_prob(batch, "ref")
    actor = worker.compute_log_prob(batch, "actor")
    if args.get("old_pass"):  # the old policy's log-probs from their own pass, as the driver
        batch = batch.with_tensors(old_log_probs=actor)
    metrics, grads = [], {}
    for step in range(args["steps"]):
        metrics.append(worker.update(batch, step))
        grads[step] = gradients(worker)
    policy = worker.compute_log_prob(batch)
    if args.get("hf_weights"):
        from mindrl.checkpoint.online import iter_hf_tensors

        named = iter_hf_tensors(worker.model_chunks, run.actor.model, to_tp_rank0_only=True)
        weights = {name: t.detach().clone() for name, t in named}
        if worker.info.rank == 0:
            torch.save(weights, args["hf_weights"])
    if worker.info.rank == 0:
        torch.save(grads, args["grads"])
    out = {
        "ref": ref.tolist(),
        "actor": actor.tolist(),
        "metrics": [{k: v for k, v in m.items() if not k.startswith("timing/")} for m in metrics],
        "policy": policy.tolist(),
    }
    worker.shutdown()
    return out


if __name__ == "__main__":
    json_main(main)
