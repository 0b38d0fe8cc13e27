"""The metrics of one RL step beyond what the roles report: score, lengths, throughput and
the train/rollout log-prob mismatch."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from mindrl.data.batch import SampleBatch


def step_metrics(
    batch: SampleBatch,
    scores: torch.Tensor,
    times: Mapping[str, float],
    *parts: Mapping[str, float],
    epochs: int = 1,
) -> dict[str, float]:
    from mindrl.algorithms import rollout_mismatch_metrics
    from mindrl.trainer.metrics import summarize

    resp = batch.response_lengths.float()
    tokens = float(resp.sum() + batch.prompt_lengths.float().sum())
    out: dict[str, float] = {"grpo/score": float(scores.mean())}
    for part in parts:
        out.update(part)
    out.update(times)
    out.update(summarize(resp.tolist(), "response_length"))
    out.update(summarize(batch.prompt_lengths.float().tolist(), "prompt_length"))
    out["response_length/clip_ratio"] = (
        sum(f == "length" for f in batch.meta["finish_reason"]) / batch.size
    )
    if "old_log_probs" in batch.tensors:  # else the update measured it on-policy
        out.update(
            rollout_mismatch_metrics(
                batch.tensors["old_log_probs"],
                batch.tensors["rollout_log_probs"],
                batch.response_mask,
            )
        )
    out["e2e_tps"] = tokens / max(times["timing/step"], 1e-9)
    out["update_tps"] = tokens * epochs / max(times["timing/update"], 1e-9)
    if "timing/rollout" in times:  # else generated during the previous step (pipeline)
        out["vllm_tps"] = float(resp.sum()) / max(times["timing/rollout"], 1e-9)
    return out
