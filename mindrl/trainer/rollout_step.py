"""The rollout step on the driver: the step's sampling settings, prompts spread over the
generating ranks, their rows put back in prompt order as a `SampleBatch`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mindrl.cluster.calls import split_evenly
from mindrl.config.run import RunConfig
from mindrl.data.batch import SampleBatch, build_sample_batch
from mindrl.data.tool_kwargs import ToolsKwargs, record_tools_kwargs
from mindrl.rollout.base import RolloutRow, RolloutSampling
from mindrl.workers.facades import RolloutGenerator


def step_seed(run: RunConfig, step: int) -> int:
    """The step's sampling seed (`generate_config.sampling_config.seed`, else the data seed),
    so the same step samples the same responses, resumed or not."""
    cfg = run.generate.sampling_config
    base = cfg.seed if cfg.seed is not None else run.actor.data.seed
    return base * 100_003 + step


def step_sampling(run: RunConfig, step: int, *, validation: bool = False) -> RolloutSampling:
    """The step's sampling: n per prompt (1 and greedy for validation) and the step's seed
    (`step_seed`)."""
    cfg = run.generate.sampling_config
    n = 1 if validation else run.rl.algorithm.n_samples_per_prompt
    sampling = replace(RolloutSampling.from_config(cfg, n), seed=step_seed(run, step))
    return replace(sampling, temperature=0.0) if validation else sampling


def assemble_rollouts(
    chunk_sizes: Sequence[int],
    slice_of_rank: Sequence[int],
    rows_by_rank: Sequence[list[RolloutRow] | None],
) -> list[RolloutRow]:
    """Rows of every slice in slice order, prompt indices counted over all prompts.

    Rank r generated slice `slice_of_rank[r]`; several ranks may share a slice (an
    inference-TP group), and only one of them returns rows (the others None).
    """
    per_slice: list[list[RolloutRow] | None] = [None] * len(chunk_sizes)
    for s, rows in zip(slice_of_rank, rows_by_rank):
        if per_slice[s] is None and rows is not None:
            per_slice[s] = rows
    out: list[RolloutRow] = []
    offset = 0
    for s, size in enumerate(chunk_sizes):
        rows = per_slice[s]
        if rows is None:
            raise RuntimeError(f"no rank returned the rollouts of prompt slice {s}")
        out.extend(row.shifted(offset) for row in rows)
        offset += size
    return out


def dataset_columns(record: Any) -> dict[str, Any]:
    """The prompt store's extra columns of a record (its dataset_additional_keys, chosen at
    preprocessing), for the verifiers (`SampleMeta.extra`); not its index / row."""
    meta = getattr(record, "metadata", None) or {}
    return {k: v for k, v in meta.items() if k not in ("index", "row")}


def generate_batch(
    generator: RolloutGenerator, records: Sequence[Any], sampling: RolloutSampling, pad_id: int
) -> SampleBatch:
    """n responses per prompt record, one slice of the prompts per generating rank."""
    prompts, chunks, slices = spread_prompts(generator, records)
    rows_by_rank = generator.generate_in_rollout_mode(
        [list(chunks[s]) for s in slices], sampling, tools_kwargs_per_rank(records, slices)
    )
    return rows_to_batch(records, prompts, chunks, slices, rows_by_rank, pad_id)


def tools_kwargs_per_rank(
    records: Sequence[Any], slices: Sequence[int]
) -> list[list[ToolsKwargs]] | None:
    """Each generating rank's tools_kwargs, one per prompt of its slice (split as
    `spread_prompts` splits the prompts); None when no record has any."""
    kwargs = [record_tools_kwargs(getattr(r, "metadata", None)) for r in records]
    if not any(kwargs):
        return None
    chunks = split_evenly(kwargs, max(slices) + 1)
    return [list(chunks[s]) for s in slices]


def generate_rows(
    generator: RolloutGenerator, prompts: list[list[int]], sampling: RolloutSampling
) -> list[RolloutRow]:
    """`sampling.n` rows per prompt, in prompt order, one slice per generating rank (the
    caller puts the generator in rollout mode)."""
    slices = generator.rollout_ranks()
    chunks = split_evenly(prompts, max(slices) + 1)
    rows_by_rank = generator.generate([list(chunks[s]) for s in slices], sampling)
    return assemble_rollouts([len(c) for c in chunks], slices, rows_by_rank)


def spread_prompts(
    generator: RolloutGenerator, records: Sequence[Any]
) -> tuple[list[list[int]], list[Sequence[list[int]]], list[int]]:
    """The records' prompts, their slices, and the slice each generating rank takes."""
    prompts = [list(r.prompt_ids) for r in records]
    slices = generator.rollout_ranks()
    return prompts, split_evenly(prompts, max(slices) + 1), slices


def rows_to_batch(
    records: Sequence[Any],
    prompts: list[list[int]],
    chunks: Sequence[Sequence[list[int]]],
    slices: Sequence[int],
    rows_by_rank: Sequence[list[RolloutRow] | None],
    pad_id: int,
) -> SampleBatch:
    """The generating ranks' rows as one batch in prompt order, with the records' labels,
    texts and dataset columns."""
    rows = assemble_rollouts([len(c) for c in chunks], slices, rows_by_rank)
    source = [records[r.prompt_index] for r in rows]
    meta = {
        "label": [rec.label for rec in source],
        "prompt_text": [rec.prompt_text for rec in source],
        "finish_reason": [r.finish_reason for r in rows],
        "extra": [dataset_columns(rec) for rec in source],
    }
    multi_turn = any(r.agent is not None for r in rows)
    if multi_turn:  # what each sample's agent loop did, for the step's metrics
        meta["agent"] = [r.agent for r in rows]
    return build_sample_batch(
        [prompts[r.prompt_index] for r in rows],
        [r.token_ids for r in rows],
        pad_id,
        meta=meta,
        rollout_log_probs=[r.log_probs for r in rows],
        loss_masks=[r.loss_mask for r in rows] if multi_turn else None,
    )
