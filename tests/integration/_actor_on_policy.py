"""Run by test_actor_worker.py through the `fresh_process` fixture: an ActorWorker (world of
one, real megatron-core, HF rollout engine) scores one sampled batch and takes one update,
either with recomputed old log-probs or on-policy (without them).

Arguments: {"mode": "recompute" | "on_policy", "tensors_file": PT_FILE}. Result: the update
metrics; the tensors (log-probs of all tokens / response only, masks, initial and updated
weights) go to `tensors_file` (torch.save), which the result names."""

from typing import Any

import torch

from tests.fresh_process import json_main


def main(args: dict[str, Any]) -> dict[str, Any]:
    mode, out_file = args["mode"], args["tensors_file"]
    from _actor_setup import actor_and_sampled_batch

    from mindrl.algorithms import compute_advantages
    from mindrl.models.forward_pass import forward_only

    # 8 prompts x 8 samples in one mini-batch: one optimizer step per RL step
    run, worker, batch = actor_and_sampled_batch(["rl_config.mini_batch_size=8"])
    every_token = forward_only(
        worker.model_chunks,
        batch.input_ids,
        vocab_size=run.actor.model.vocab_size,
        attention_mask=batch.attention_mask,
        micro_batch_size=8,
    )
    old = worker.compute_log_prob(batch)  # response tokens only
    adv = compute_advantages("group_norm", torch.rand(batch.size), 8, batch.response_mask)
    batch = batch.with_tensors(advantages=adv, ref_log_probs=old - 0.05)
    if mode == "recompute":
        batch = batch.with_tensors(old_log_probs=old)
    initial = [p.detach().clone() for p in worker.model_chunks[0].parameters()]
    metrics = worker.update(batch, 0)
    torch.save(
        {
            "every_token": every_token,
            "response_only": old,
            "response_mask": batch.response_mask,
            "attention_mask": batch.attention_mask,
            "initial": initial,
            "weights": [p.detach().clone() for p in worker.model_chunks[0].parameters()],
        },
        out_file,
    )
    worker.shutdown()
    return {"metrics": {k: float(v) for k, v in metrics.items()}, "tensors_file": out_file}


if __name__ == "__main__":
    json_main(main)
