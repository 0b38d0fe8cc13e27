"""The fast settings a config leaves off, in one line for the dry run and every run's start.

The CPU configs shipped with mindrl turn on what the benchmarks (docs/benchmarks.md) found
fastest and leanest; MindSpeed-RL's own configs keep MindSpeed-RL's defaults, which mean what
they mean there. Either way a user sees which of those settings a config does not use and
could, without reading a benchmark table. A setting that cannot apply to the run (no
reference model, a rollout that is not vLLM's, a backend that refuses it) is not listed.
Imports no torch: the dry run reads it.
"""

from __future__ import annotations

from mindrl.config.run import RunConfig

# rl_config.share_prompt_forward builds its mask for megatron's local attention (packing.py)
SHARED_PROMPT_ACCELERATORS = ("cpu",)


def fast_settings_left_off(run: RunConfig) -> list[str]:
    """The fast settings `run` could use and does not, each as the keys that turn it on."""
    off = _reference_layout(run)
    mb = run.rl.micro_batching
    if not mb.use_remove_padding:
        off.append("rl_config.use_remove_padding: true")
    if not mb.use_dynamic_bsz:
        off.append("rl_config.use_dynamic_bsz: true (with *_max_packing_token_size budgets)")
    if (
        not mb.share_prompt_forward
        and run.runtime.accelerator in SHARED_PROMPT_ACCELERATORS
        and run.actor.cp == 1  # not built with context parallel (config/packing.py)
    ):
        off.append("rl_config.share_prompt_forward: true")
    alg = run.rl.algorithm
    if (
        alg.recompute_old_log_prob == "auto"
        and run.optimizer_steps_per_rl_step > 1
        and alg.epochs == 1
    ):
        off.append("rl_config.recompute_old_log_prob: in_update")
    if run.generate.enforce_eager and _rollout_may_compile(run):
        off.append("generate_config.enforce_eager: false")
    precision = _cpu_precision(run)
    if precision:
        off.append(precision)
    return off


def fast_settings_line(run: RunConfig) -> str:
    off = fast_settings_left_off(run)
    return f"fast settings left off: {'; '.join(off) if off else 'none'}"


def _reference_layout(run: RunConfig) -> list[str]:
    """The reference without processes of its own: the LoRA base, or a weight snapshot of the
    integrated reference (which needs the actor's architecture: the integrated worker)."""
    if run.ref is None or run.reference_in_actor:
        return []
    if run.actor.lora.enabled:
        return ["rl_config.share_backbone: true (the reference is the LoRA base)"]
    if run.rl.resources.use_integrated_worker:
        return ["rl_config.reference_in_actor: true"]
    return ["rl_config.use_integrated_worker: true with reference_in_actor: true (no ref_config)"]


def _rollout_may_compile(run: RunConfig) -> bool:
    """vLLM's compiled mode applies: the rollout is (or may be) vLLM's own engine here."""
    return not (run.generate.rollout_backend == "hf" or run.rollout_on_servers)


def _cpu_precision(run: RunConfig) -> str | None:
    """On a CPU config, the training precision this machine's fast path calls for, when the
    config trains in the other one."""
    if run.runtime.accelerator != "cpu":
        return None
    from mindrl.accelerator.cpu_precision import fast_cpu_precision

    fast = fast_cpu_precision()
    training = "fp32" if run.actor.precision.params_dtype == "fp32" else "bf16"
    if training == fast.name:
        return None
    return (
        f"megatron_training.bf16: {str(fast.bf16).lower()} (this CPU's fast matmuls: {fast.name})"
    )
