"""One rank of the MoE health run (tests/integration/test_moe_health.py): an ActorWorker (real
megatron-core, no rollout engine) on the tiny DeepSeek-V3 with the test's overrides, a few
updates of one fixed synthetic batch (one optimizer step each).

Arguments: {"hf_dir", "overrides": [...], "steps": int}. Result per rank, per step: the step
metrics, this rank's own expert counts (before any reduction), its tokens fed, and its routers'
expert biases before and after the update (read from megatron's buffers)."""

from __future__ import annotations

from typing import Any

from tests.fresh_process import json_main
from tests.integration._rank_start import rank_run_config
from tests.integration._scale_rank import synthetic_batch


def _biases(worker: Any) -> dict[int, list[float]]:
    from megatron.core.transformer.moe.router import TopKRouter

    return {
        int(m.layer_number) - 1: m.expert_bias.tolist()
        for chunk in worker.model_chunks
        for m in chunk.modules()
        if isinstance(m, TopKRouter) and m.expert_bias is not None
    }


def main(args: dict[str, Any]) -> dict[str, Any]:
    run = rank_run_config(
        "grpo_tiny_cpu", [f"actor_config.load={args['hf_dir']}", *args["overrides"]]
    )
    from mindrl.workers.actor import ActorWorker

    worker = ActorWorker(run, with_rollout=False)
    worker.init_model()
    info = worker.info
    share = synthetic_batch(run.actor.model.vocab_size).chunks(info.dp_size)[info.dp_rank]
    steps = []
    for step in range(args["steps"]):
        before = _biases(worker)
        metrics = worker.update(share, step)
        assert worker.updater is not None
        steps.append(
            {
                "metrics": {k: v for k, v in metrics.items() if not k.startswith("timing/")},
                "counts": worker.updater.expert_load.counts.tolist(),
                "tokens": int(worker.updater.tokens["fed"]),
                "bias_before": before,
                "bias_after": _biases(worker),
            }
        )
    worker.shutdown()
    return {"steps": steps, "dp_size": info.dp_size}


if __name__ == "__main__":
    json_main(main)
