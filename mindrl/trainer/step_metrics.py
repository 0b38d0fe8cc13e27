"""The metrics of one RL step beyond what the roles report: score, lengths, throughput, the
train/rollout log-prob mismatch, and how much of the reference and old-policy passes' input
is padding.

The reference and old-policy passes return log-probs only, so for their padding the driver
plans their micro-batches the way the workers do (`mindrl.data.packing`, per data-parallel
chunk, every rank running as many micro-batches as the rank that needs most) and counts the
tokens fed; the update measures its own (`perf/padding_fraction_actor_update`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from mindrl.data.batch import SampleBatch, micro_batch_size
from mindrl.data.packing import pass_packing, plan_micro_batches, round_up

if TYPE_CHECKING:
    from mindrl.config.role import RoleConfig
    from mindrl.config.run import RunConfig
    from mindrl.data.packing import PackingSettings


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


def pass_padding_fraction(
    batch: SampleBatch, run: RunConfig, role: RoleConfig, pass_name: str
) -> float:
    """1 - real tokens / tokens fed to the model, summed over `role`'s data-parallel ranks."""
    settings = pass_packing(run.rl.micro_batching, pass_name)
    multiple = role.tp if role.parallel.sequence_parallel else 1
    chunks = batch.chunks(role.dp)
    lengths = [c.attention_mask.sum(-1).tolist() for c in chunks]
    mbs = micro_batch_size(role.batch.micro_batch_size, chunks[0].size)
    plans = [_plan(c, n, settings, mbs) for c, n in zip(chunks, lengths)]
    if settings.dynamic_bsz:
        most = max(len(p) for p in plans)
        plans = [_plan(c, n, settings, mbs, most) for c, n in zip(chunks, lengths)]
    real = fed = 0
    for chunk, sizes, groups in zip(chunks, lengths, plans):
        if settings.remove_padding:
            tokens = [sum(sizes[i] for i in g) for g in groups]
            if settings.share_prompts:  # the samples' tokens fed: each shared prompt once
                from mindrl.data.prefix_sharing import shared_group_tokens

                tokens = shared_group_tokens(
                    chunk.input_ids, chunk.attention_mask, chunk.prompt_lengths, groups
                )
            real += sum(tokens)
            packed = [round_up(t, multiple) for t in tokens]
            fed += len(packed) * max(packed) if role.pp > 1 else sum(packed)
        else:
            real += sum(sizes)
            width = round_up(batch.input_ids.shape[1], multiple)
            for g in groups:
                longest = width if role.pp > 1 else round_up(max(sizes[i] for i in g), multiple)
                fed += len(g) * longest
    return 1 - real / fed if fed else 0.0


def padding_metrics(batch: SampleBatch, run: RunConfig, old_log_probs: bool) -> dict[str, float]:
    """`perf/padding_fraction_{ref,actor}` of the passes this step ran."""
    out = {}
    if run.ref is not None:  # a reference in the actor runs on its layout
        ref_role = run.actor if run.reference_in_actor else run.ref
        out["perf/padding_fraction_ref"] = pass_padding_fraction(batch, run, ref_role, "ref")
    if old_log_probs:
        out["perf/padding_fraction_actor"] = pass_padding_fraction(batch, run, run.actor, "actor")
    return out


def _plan(
    chunk: SampleBatch, lengths: list[int], settings: PackingSettings, mbs: int, min_parts: int = 1
) -> list[list[int]]:
    """The micro-batches a worker forms for `chunk` (as `models.micro_batches.pass_groups`)."""
    if settings.share_prompts:
        from mindrl.data.prefix_sharing import plan_shared_micro_batches

        return plan_shared_micro_batches(
            chunk.input_ids, chunk.attention_mask, chunk.prompt_lengths, settings, mbs, min_parts
        )
    return plan_micro_batches(lengths, settings, mbs, min_parts)
