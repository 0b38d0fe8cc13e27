"""Cross-field rules of the scale keys (sequence parallel, virtual pipeline, recompute,
overlap, Adam's moment dtypes), checked at config time with megatron-core's own conditions,
so a layout megatron would reject fails before any worker starts and names the YAML key."""

from __future__ import annotations

from mindrl.config.layer_layout import layout_problems
from mindrl.config.role import ROLE_NAMES, RoleConfig


def scale_problems(role: RoleConfig) -> list[str]:
    sec = ROLE_NAMES[role.role]
    problems = (
        *_stage_layers(role),
        *_virtual_pipeline(role),
        *_recompute(role),
        *_overlap(role),
        *_moment_dtypes(role),
        *_context_parallel(role),
    )
    return [f"{sec}.{p}" for p in problems]


def _stage_layers(role: RoleConfig) -> list[str]:
    """MindSpeed's `num_layer_list` and `noop_layers` against the model and the pipeline
    (`config/layer_layout.py`), before anything is built."""
    return layout_problems(
        role.model.num_layers,
        role.pp,
        role.parallel.num_layer_list,
        role.model.noop_layers,
        virtual_pipeline=role.parallel.num_layers_per_virtual_pipeline_stage is not None,
    )


def _virtual_pipeline(role: RoleConfig) -> list[str]:
    per_chunk = role.parallel.num_layers_per_virtual_pipeline_stage
    if per_chunk is None:
        return []
    layers, pp = role.model.num_layers, role.pp
    if pp < 2:
        return [
            "num_layers_per_virtual_pipeline_stage: the virtual pipeline needs "
            f"pipeline_model_parallel_size > 1 (it is {pp})"
        ]
    if layers % (pp * per_chunk):
        return [
            f"num_layers_per_virtual_pipeline_stage: PP ({pp}) x {per_chunk} layers per chunk "
            f"does not divide num_layers ({layers})"
        ]
    if layers // (pp * per_chunk) < 2:
        return [
            f"num_layers_per_virtual_pipeline_stage: {per_chunk} gives one chunk per pipeline "
            f"rank ({layers} layers / PP {pp}); that is the plain pipeline: unset it"
        ]
    return []


def _recompute(role: RoleConfig) -> list[str]:
    mem = role.memory
    granularity, method, n = (
        mem.recompute_granularity,
        mem.recompute_method,
        mem.recompute_num_layers,
    )
    if granularity is None:
        if method is not None or n is not None:
            return [
                "recompute_method / recompute_num_layers: only read with "
                "recompute_granularity: full"
            ]
        return []
    if granularity == "selective":
        if method is not None or n is not None:
            return [
                "recompute_method / recompute_num_layers: selective recompute takes neither "
                "(megatron recomputes the attention core of every layer)"
            ]
        return []
    if method is None or n is None:
        return [
            "recompute_granularity: full needs recompute_method (uniform | block) and "
            "recompute_num_layers"
        ]
    per_stage = role.model.num_layers // max(role.pp, 1)
    chunk = role.parallel.num_layers_per_virtual_pipeline_stage or per_stage
    if n > chunk:
        return [
            f"recompute_num_layers: {n} is more than the {chunk} layers of each model chunk "
            "(num_layers / PP, or num_layers_per_virtual_pipeline_stage)"
        ]
    return []


def _overlap(role: RoleConfig) -> list[str]:
    mem, par = role.memory, role.parallel
    if mem.overlap_param_gather and not (par.use_distributed_optimizer and mem.overlap_grad_reduce):
        return [
            "overlap_param_gather: needs use_distributed_optimizer: true and "
            "overlap_grad_reduce: true (megatron gathers the updated shards in the next forward)"
        ]
    return []


def _moment_dtypes(role: RoleConfig) -> list[str]:
    """megatron's rule: the moments' dtypes are only read by the precision-aware optimizer."""
    o = role.optim
    narrowed = [k for k in ("exp_avg_dtype", "exp_avg_sq_dtype") if getattr(o, k) != "fp32"]
    if narrowed and not o.use_precision_aware_optimizer:
        return [
            f"{' / '.join(narrowed)}: only read with use_precision_aware_optimizer: true "
            "(as in megatron)"
        ]
    return []


def _context_parallel(role: RoleConfig) -> list[str]:
    """The Ulysses degree (`ulysses_cp_algo`: CP, `hybrid_cp_algo`: `ulysses_degree_in_cp`)
    against CP and the heads each TP rank holds (Ulysses splits them over its ranks)."""
    par = role.parallel
    hybrid = par.context_parallel_algo == "hybrid_cp_algo"
    if par.ulysses_degree_in_cp is not None and not (hybrid and role.cp > 1):
        return [
            "ulysses_degree_in_cp: read only with context_parallel_algo hybrid_cp_algo and "
            "context_parallel_size > 1"
        ]
    if role.cp == 1 or par.context_parallel_algo == "megatron_cp_algo":
        return []
    ulysses = par.ulysses_degree_in_cp if hybrid else role.cp
    if hybrid and (ulysses is None or role.cp % ulysses or role.cp == ulysses):
        return [
            f"ulysses_degree_in_cp: {ulysses} must divide context_parallel_size ({role.cp}) "
            "and leave a ring of 2 or more (hybrid_cp_algo)"
        ]
    assert ulysses is not None
    heads = role.model.num_attention_heads // role.tp
    if heads % ulysses:
        return [
            f"context_parallel_algo: {par.context_parallel_algo} splits each TP rank's "
            f"{heads} attention heads over {ulysses} Ulysses ranks: not a divisor"
        ]
    return []
