"""Run by test_actor_gpu.py through the `fresh_process` fixture: an ActorWorker (world of one,
real megatron-core and its optimizer, HF rollout engine) on grpo_tiny_cpu moved to one CUDA
device in bf16: old-policy and reference log-probs, one update, the weight sync into the
engine, the training state offloaded for rollout and back (device memory measured), and the
HF export the converter writes.

Arguments: {"export_dir": PATH}. Result: the numbers the test asserts on."""

from typing import Any

import torch

from tests.fresh_process import json_main
from tests.integration._actor_setup import actor_and_sampled_batch

GIB = float(1 << 30)
OVERRIDES = [
    "runtime.accelerator=cuda",
    "actor_config.bf16=true",
    "rl_config.mini_batch_size=8",  # one optimizer step per update
    "rl_config.use_integrated_worker=true",  # the reference as a weight snapshot in the actor
    "~ref_config",
    "rl_config.reference_in_actor=true",
    "rl_config.share_prompt_forward=false",  # its mask is built for CPU's local attention
    *(f"generate_config.offload_train_{part}=true" for part in ("param", "grad", "optimizer")),
]


def main(args: dict[str, Any]) -> dict[str, Any]:
    from mindrl.algorithms import compute_advantages
    from mindrl.data.dataset import PromptDataset
    from mindrl.rollout import RolloutSampling

    run, worker, batch = actor_and_sampled_batch(OVERRIDES)
    worker.train_mode()
    old = worker.compute_log_prob(batch)
    ref = worker.compute_ref_log_prob(batch)
    mask = batch.response_mask
    scores = torch.rand(batch.size, generator=torch.Generator().manual_seed(0))
    adv = compute_advantages("group_norm", scores, 8, mask)
    metrics = worker.update(
        batch.with_tensors(advantages=adv, ref_log_probs=ref, old_log_probs=old), 0
    )
    after = worker.compute_log_prob(batch)
    torch.cuda.synchronize()
    train_bytes = torch.cuda.memory_allocated()
    sync = worker.sync_weights()
    worker.rollout_mode()
    torch.cuda.synchronize()
    rollout_bytes = torch.cuda.memory_allocated()
    prompts = [list(PromptDataset(run.actor.data.data_path)[i].prompt_ids) for i in (8, 9)]
    rows = worker.generate(prompts, RolloutSampling(temperature=0, max_tokens=8))
    worker.train_mode()
    back_bytes = torch.cuda.memory_allocated()
    lp_again = worker.compute_log_prob(batch)
    exported = worker.export_hf(args["export_dir"])
    dtypes = sorted({str(p.dtype) for c in worker.model_chunks for p in c.parameters()})
    worker.shutdown()
    return {
        "param_dtypes": dtypes,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "old_ref_gap": float(((old - ref).abs() * mask).max()),
        "moved_by_update": float(((after - old).abs() * mask).max()),
        "same_after_onload": float(((lp_again - after).abs() * mask).max()),
        "sync_metrics": {k: float(v) for k, v in sync.items()},
        "train_gib": train_bytes / GIB,
        "rollout_gib": rollout_bytes / GIB,
        "train_again_gib": back_bytes / GIB,
        "generated": [len(r.token_ids) for r in rows],
        "exported": exported,
    }


if __name__ == "__main__":
    json_main(main)
