"""What a config means where readings could differ, said before anything starts.

MindSpeed-RL's generations disagree on some keys (`mini_batch_size` counts prompts in 2.x,
samples in 1.x) and mindrl's peers use other keys for the same thing (verl's `use_kl_loss`):
the dry run and every run print the reading mindrl took, so a user sees it before spending
a cluster hour.
"""

from __future__ import annotations

from mindrl.config.dapo import DAPO
from mindrl.config.fast_settings import fast_settings_line
from mindrl.config.run import RunConfig


def optimizer_steps_line(run: RunConfig) -> str:
    alg = run.rl.algorithm
    gbs = run.train_prompts
    samples = gbs * alg.n_samples_per_prompt
    mini = alg.mini_batch_samples or samples
    how = (
        "the whole batch"
        if not alg.mini_batch_size
        else f"mini_batch_size {alg.mini_batch_size} {alg.mini_batch_size_unit} = {mini} samples"
    )
    return (
        f"optimizer steps per RL step: {run.optimizer_steps_per_rl_step} "
        f"({samples} samples per step, {how}, epochs {alg.epochs})"
    )


def mini_batch_reading_notice(run: RunConfig) -> str | None:
    """When both readings of mini_batch_size are valid but give different step counts."""
    alg = run.rl.algorithm
    if not alg.mini_batch_size:
        return None
    gbs, n = run.train_prompts, alg.n_samples_per_prompt
    samples = gbs * n
    as_prompts = alg.mini_batch_size * n
    as_samples = alg.mini_batch_size
    if samples % as_prompts or samples % as_samples or as_prompts == as_samples:
        return None
    other = "samples" if alg.mini_batch_size_unit == "prompts" else "prompts"
    other_steps = alg.epochs * samples // (as_samples if other == "samples" else as_prompts)
    return (
        f"note: mini_batch_size {alg.mini_batch_size} is read as {alg.mini_batch_size_unit}; "
        f"read as {other} (rl_config.mini_batch_size_unit: {other}) it would give "
        f"{other_steps} optimizer step(s) per RL step"
    )


def dpo_meaning_lines(run: RunConfig) -> list[str]:
    """What a stage dpo run does, in the dry run's words."""
    actor, dpo = run.actor, run.actor.dpo
    loss = f"DPO loss {dpo.dpo_loss_type}, beta {dpo.dpo_beta}"
    if dpo.dpo_label_smoothing:
        loss += f", label smoothing {dpo.dpo_label_smoothing} (cDPO)"
    if dpo.pref_ftx:
        loss += f", + {dpo.pref_ftx} x the chosen answers' SFT loss (pref_ftx)"
    ref = run.ref.ckpt.load if run.ref is not None else None
    return [
        f"offline DPO: {actor.optim.train_iters} steps of {actor.batch.global_batch_size} "
        f"pairs (one optimizer step each; micro-batches of {actor.batch.micro_batch_size} "
        "pair(s): chosen + rejected rows)",
        loss,
        f"reference model: {ref}, a snapshot of its weights in the actor's processes; its "
        "log-probs computed once per batch",
        "rollout: none (pairs from the pairwise store at data_path)",
        f"precision: {precision_line(run)}",
        *run.notes,
    ]


def meaning_lines(run: RunConfig) -> list[str]:
    if run.offline:
        return dpo_meaning_lines(run)
    lines = [optimizer_steps_line(run), run.rl.algorithm.kl.describe()]
    notice = mini_batch_reading_notice(run)
    if notice:
        lines.append(notice)
    ref = "none"
    if run.shares_backbone:
        ref = "the actor's base model with its LoRA adapters off (share_backbone; no copy)"
    elif run.reference_snapshot:
        ref = (
            "a snapshot of actor_config's weights in the actor's processes, swapped in for "
            "its pass (integrated worker, reference_in_actor; no reference processes)"
        )
    elif run.ref is not None:
        ref = (
            "built from actor_config (integrated worker), on the actor's devices"
            if run.rl.resources.use_integrated_worker
            else "ref_config"
        )
    lines.append(f"reference model: {ref}")
    if run.teacher is not None:
        lines.append(f"distillation: {distillation_line(run)}")
    lines.append(f"rollout: {rollout_line(run)}")
    lines.append(f"precision: {precision_line(run)}")
    stage = dapo_line(run)
    if stage:
        lines.append(stage)
    lines.append(fast_settings_line(run))
    lines.extend(run.notes)
    return lines


def distillation_line(run: RunConfig) -> str:
    """On-policy distillation: the teacher and what the advantage is made of."""
    cfg, teacher = run.rl.distillation, run.teacher
    assert teacher is not None
    task = (
        f" + the {run.rl.algorithm.adv_estimator} advantage of the rewards (use_task_rewards)"
        if cfg.use_task_rewards
        else " (the reward does not enter the advantage)"
    )
    return (
        f"teacher model {teacher.model.name!r} from {teacher.ckpt.load} on "
        f"{teacher.num_devices} device(s); advantage = -{cfg.opd_kl_coef:g} x "
        f"(log p_student - log p_teacher) per token{task}"
    )


def precision_line(run: RunConfig) -> str:
    """Each phase's precision; on a CPU, also whether bf16 is this machine's fast path."""
    training = run.actor.precision.params_dtype
    if training != "fp32":
        training += " (megatron's mixed precision: fp32 master weights and Adam state)"
    line = f"training {training}, rollout {run.generate.dtype}"
    if run.runtime.accelerator == "cpu":  # an explicit cpu: the CPU configs
        from mindrl.accelerator.cpu_precision import fast_cpu_precision

        fast = fast_cpu_precision()
        line += f"; {fast.reason}, its fast path is {fast.name}"
    return line


def rollout_line(run: RunConfig) -> str:
    """Where samples are generated, and how far behind the policy they may be."""
    res, splits = run.rl.resources, run.rl.rollout_mode.partial_rollout_max_split
    if run.generate.server is not None:
        where = (
            f"on vLLM server(s) {', '.join(run.generate.server.addresses())} "
            f"(generate_config.server, on_failure: {run.generate.server.on_failure})"
        )
    elif res.rollout_resource is not None:
        where = f"on {res.rollout_resource.num_npus} device(s) of its own (rollout_resource)"
    else:
        where = "on the actor's devices (hybrid engine)"
    if res.rollout_staleness:
        where += f"; up to {res.rollout_staleness} step(s) off-policy (rollout_staleness)"
    if splits > 1:
        where += f"; partial, responses in up to {splits} rounds (partial_rollout_max_split)"
    if run.rl.rollout_mode.multi_turn_enable:
        where += "; " + tools_line(run)
    return where


def tools_line(run: RunConfig) -> str:
    """Multi-turn rollout's tools as the tool YAML declares them (read, nothing imported)."""
    from mindrl.config.multi_turn import tool_config_file, tool_parser_name
    from mindrl.tools.registry import ToolConfigError, read_tool_config

    mode = run.rl.rollout_mode
    head = (
        f"multi-turn, {tool_parser_name(mode.tool_parser_format)} tool calls, at most "
        f"{mode.max_tool_calls} per response"
    )
    if not mode.tool_config_path:
        return head + ", no tool_config_path"
    path = tool_config_file(mode.tool_config_path)
    try:
        entries = read_tool_config(path)
    except ToolConfigError as exc:
        return f"{head}; tools not read here: {exc}"
    tools = ", ".join(f"{e.schema.name} ({e.class_name})" for e in entries)
    return f"{head}, tools {tools} from {path}"


def dapo_line(run: RunConfig) -> str | None:
    """What stage ray_dapo trains with, in one line (None for ray_grpo)."""
    if run.actor.data.stage != DAPO:
        return None
    alg, dapo = run.rl.algorithm, run.rl.dapo
    high = alg.clip_ratio if alg.clip_ratio_high is None else alg.clip_ratio_high
    parts = [
        f"ratio clipped to [{1 - alg.clip_ratio:g}, {1 + high:g}]",
        f"loss {alg.loss_agg_mode}",
        "no KL",
    ]
    if dapo.filter_groups_enable:
        limit = dapo.filter_groups_max_batches
        parts.append(
            f"dynamic sampling: {dapo.filter_groups_train_batch_size} prompts whose "
            f"{dapo.filter_groups_metric} scores differ, from at most "
            f"{limit if limit > 0 else 'unlimited'} batch(es) of "
            f"{run.actor.batch.global_batch_size}"
        )
    if dapo.overlong_buffer_enable:
        parts.append(
            f"overlong buffer: the last {dapo.overlong_buffer} of {dapo.rollout_max_tokens} "
            f"tokens down to -{dapo.overlong_buffer_penalty_factor:g}"
        )
    return "stage ray_dapo: " + "; ".join(parts)
