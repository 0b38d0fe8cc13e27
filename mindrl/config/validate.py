"""Cross-field rules, checked once before Ray or any worker starts.

Per-key types and ranges are checked when the typed config is built (`build.py`); this module
checks what only the whole config can tell: parallel layouts against devices and model shape,
batch sizes against micro batch x DP, verifier names, paths on disk.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mindrl.algorithms.names import GROUP_ESTIMATORS, RETURN_ESTIMATORS
from mindrl.config.dapo import DAPO, dapo_problems
from mindrl.config.dpo import DPO, dpo_problems
from mindrl.config.errors import ConfigError
from mindrl.config.fates import is_default, warn_once
from mindrl.config.lora import lora_problems
from mindrl.config.multi_turn import multi_turn_problems
from mindrl.config.packing import packing_problems
from mindrl.config.pipeline import partial_rollout_problems, pipeline_problems
from mindrl.config.ppo import ppo_problems
from mindrl.config.rl import MIN_VERIFIER_MEMORY_MB, AlgorithmConfig
from mindrl.config.role import ROLE_NAMES, RoleConfig
from mindrl.config.rollout_correction import rollout_correction_problems
from mindrl.config.rollout_server import server_problems
from mindrl.config.run import RunConfig
from mindrl.config.scale_rules import scale_problems
from mindrl.config.writable import unwritable_reason


def _expert_layout_problems(role: RoleConfig, resource_key: str) -> list[str]:
    """Megatron's expert parallel group: each rank holds num_experts / EP experts, and the
    expert layout TP x EP x PP (each expert split over TP) tiles the role's devices. Caught
    here, not by an assertion inside a worker's megatron set-up."""
    ep, m = role.moe.expert_model_parallel_size, role.model
    if ep == 1 or not m.num_experts:  # a dense model with EP > 1 is refused with the family
        return []
    sec = ROLE_NAMES[role.role]
    out = []
    if m.num_experts % ep:
        out.append(
            f"{sec}.expert_model_parallel_size: {ep} does not divide num_experts "
            f"({m.num_experts}) of model {m.name!r}"
        )
    experts_layout = role.tp * ep * role.pp
    if role.num_devices % experts_layout:
        out.append(
            f"{sec}.expert_model_parallel_size: TP ({role.tp}) x EP ({ep}) x PP ({role.pp}) = "
            f"{experts_layout} does not divide the role's {role.num_devices} device(s) "
            f"(rl_config.{resource_key}.num_npus)"
        )
    return out


def _role_layout_problems(role: RoleConfig, resource_key: str) -> list[str]:
    sec = ROLE_NAMES[role.role]
    tp, pp, m = role.tp, role.pp, role.model
    out = []
    cp = role.cp
    if role.num_devices % (tp * pp * cp):
        with_cp = f" x CP ({cp})" if cp > 1 else ""
        out.append(
            f"{sec}.tensor_model_parallel_size: TP ({tp}) x PP ({pp}){with_cp} = "
            f"{tp * pp * cp} does not divide the role's {role.num_devices} device(s) "
            f"(rl_config.{resource_key}.num_npus)"
        )
    out.extend(_expert_layout_problems(role, resource_key))
    if m.num_attention_heads % tp:
        out.append(
            f"{sec}.tensor_model_parallel_size: {tp} does not divide num_attention_heads "
            f"({m.num_attention_heads}) of model {m.name!r}"
        )
    if m.num_kv_heads % tp:
        out.append(
            f"{sec}.tensor_model_parallel_size: {tp} does not divide the kv heads "
            f"(num_query_groups={m.num_kv_heads}) of model {m.name!r}"
        )
    if m.num_layers % pp and role.parallel.num_layer_list is None:
        out.append(
            f"{sec}.pipeline_model_parallel_size: {pp} does not divide num_layers "
            f"({m.num_layers}) of model {m.name!r}"
        )
    if m.group_query_attention and not m.num_query_groups:
        out.append(f"model.{m.name}.num_query_groups: required when group_query_attention is true")
    if m.num_attention_heads % m.num_kv_heads:
        out.append(
            f"model.{m.name}.num_query_groups: {m.num_kv_heads} does not divide "
            f"num_attention_heads ({m.num_attention_heads})"
        )
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        out.append(
            f"model.{m.name}.hidden_size: {m.hidden_size} is not a multiple of "
            f"num_attention_heads ({m.num_attention_heads}); set kv_channels"
        )
    out.extend(f"model.{m.name}.{problem}" for problem in m.rope_scaling_problems())
    out.extend(f"model.{m.name}.{problem}" for problem in m.moe_problems())
    out.extend(f"model.{m.name}.{problem}" for problem in m.mla_problems())
    if role.precision.bf16 and role.precision.fp16:
        out.append(f"{sec}.bf16: bf16 and fp16 are both true; choose one")
    if role.optim.min_lr > role.optim.lr and role.optim.lr_decay_style != "constant":
        out.append(f"{sec}.min_lr: {role.optim.min_lr} is above lr ({role.optim.lr})")
    out.extend(scale_problems(role))
    return out


def _batch_problems(run: RunConfig) -> list[str]:
    out = []
    alg = run.rl.algorithm
    gbs = run.train_prompts  # global_batch_size unless DAPO's dynamic sampling trims it
    samples = gbs * alg.n_samples_per_prompt
    for role in run.roles:
        sec = ROLE_NAMES[role.role]
        if role.dp == 0:
            continue  # layout error already reported
        if role.batch.global_batch_size != run.actor.batch.global_batch_size:
            out.append(
                f"{sec}.global_batch_size: {role.batch.global_batch_size} differs from the "
                f"actor's {run.actor.batch.global_batch_size}; every role sees the same batch"
            )
        step = role.batch.micro_batch_size * role.dp
        if samples % step:
            out.append(
                f"{sec}.micro_batch_size: {_prompts_key(run)} x n_samples_per_prompt = {samples} "
                f"samples is not divisible by micro_batch_size ({role.batch.micro_batch_size}) x "
                f"DP ({role.dp}) = {step}"
            )
    other_reading = _mini_batch_other_reading(alg, gbs)
    if other_reading:
        out.append(other_reading)
        return out
    mini = alg.mini_batch_samples or samples
    if samples % mini:
        out.append(
            f"rl_config.mini_batch_size: {alg.mini_batch_size} {alg.mini_batch_size_unit} = "
            f"{mini} samples does not divide the {samples} samples of a step "
            f"({_prompts_key(run)} {gbs} x n_samples_per_prompt {alg.n_samples_per_prompt})"
        )
    if run.actor.dp:
        step = run.actor.batch.micro_batch_size * run.actor.dp
        if mini % step:
            out.append(
                f"rl_config.mini_batch_size: {mini} is not divisible by the actor's "
                f"micro_batch_size x DP = {step}"
            )
    return out


def _prompts_key(run: RunConfig) -> str:
    if run.train_prompts != run.actor.batch.global_batch_size:
        return "filter_groups_train_batch_size"
    return "global_batch_size"


def _mini_batch_other_reading(alg: AlgorithmConfig, gbs: int) -> str | None:
    """A mini_batch_size that is valid only under the reading not chosen: refused, naming
    both, so a MindSpeed-RL 1.x value never silently becomes 8x the optimizer steps (or the
    reverse)."""
    n, mini = alg.n_samples_per_prompt, alg.mini_batch_size
    if not mini:
        return None
    as_prompts_ok = gbs % mini == 0
    as_samples_ok = (gbs * n) % mini == 0
    if alg.mini_batch_size_unit == "prompts" and not as_prompts_ok and as_samples_ok:
        return (
            f"rl_config.mini_batch_size: {mini} read as prompts (MindSpeed-RL 2.x, mindrl's "
            f"default) does not divide global_batch_size {gbs}; read as samples (MindSpeed-RL "
            f"1.x: 'gbs x n_samples_per_prompt') it gives {gbs * n // mini} optimizer step(s) per "
            "RL step: set rl_config.mini_batch_size_unit: samples if that is what you meant"
        )
    if alg.mini_batch_size_unit == "samples" and not as_samples_ok and as_prompts_ok:
        return (
            f"rl_config.mini_batch_size: {mini} read as samples does not divide the "
            f"{gbs * n} samples of a step; read as prompts (MindSpeed-RL 2.x) it gives "
            f"{gbs // mini} optimizer step(s) per RL step: set mini_batch_size_unit: prompts"
        )
    return None


def _kl_problems(run: RunConfig) -> list[str]:
    alg = run.rl.algorithm
    out = []
    if (
        alg.use_kl_loss
        and not alg.use_kl_in_reward
        and alg.init_kl_coef is not None
        and alg.init_kl_coef != alg.kl_loss_coef
    ):
        out.append(
            f"rl_config.init_kl_coef: {alg.init_kl_coef} and kl_loss_coef: {alg.kl_loss_coef} "
            "both set the KL-loss weight (init_kl_coef as in MindSpeed-RL's GRPO, kl_loss_coef "
            "with verl's use_kl_loss); keep one"
        )
    if alg.kl.where != "off" and run.ref is None:
        where = (
            "set use_integrated_worker: true (the reference is built from actor_config) or add "
            "ref_config"
        )
        out.append(f"rl_config.init_kl_coef: {alg.kl.describe()} needs a reference model; {where}")
    return out


def _distillation_problems(run: RunConfig) -> list[str]:
    """What on-policy distillation cannot run with (the teacher's tokenizer is compared
    with the student's where both can be read: `mindrl.data.tokenizer_match`, before the run starts)."""
    cfg = run.rl.distillation
    if not cfg.use_opd:
        return []
    out = []
    alg = run.rl.algorithm
    if alg.adv_estimator == "gae" or run.critic is not None:
        out.append(
            "rl_config.use_opd: on-policy distillation with a critic (adv_estimator gae, "
            "stage ray_ppo) is not built; use stage ray_grpo"
        )
    if cfg.use_task_rewards and not run.rl.reward.rule_reward and run.reward is None:
        out.append(
            "rl_config.use_task_rewards: true, but there is no reward (rule_reward is off "
            "and no reward model)"
        )
    return out


def _algorithm_problems(run: RunConfig) -> list[str]:
    alg = run.rl.algorithm
    out = _distillation_problems(run)
    distill_only = run.rl.distillation.use_opd and not run.rl.distillation.use_task_rewards
    if alg.adv_estimator in GROUP_ESTIMATORS and alg.n_samples_per_prompt < 2 and not distill_only:
        out.append(
            f"rl_config.n_samples_per_prompt: {alg.n_samples_per_prompt}; group-relative "
            f"advantages ({alg.adv_estimator}) need at least 2 samples per prompt"
        )
    if alg.gamma != 1.0 and alg.adv_estimator not in RETURN_ESTIMATORS:
        warn_once(
            "AlgorithmConfig.gamma",
            f"rl_config.gamma: {alg.gamma} has no effect with adv_estimator "
            f"{alg.adv_estimator} (whole-sequence scores); reinforce_plus_plus reads it",
        )
    dapo = run.actor.data.stage == DAPO  # its clip bounds are checked by dapo_problems
    if not dapo and alg.clip_ratio_high is not None and alg.clip_ratio_high < alg.clip_ratio:
        out.append(
            f"rl_config.clip_ratio_high: {alg.clip_ratio_high} is below clip_ratio "
            f"({alg.clip_ratio})"
        )
    if alg.recompute_old_log_prob == "in_update" and alg.epochs > 1:
        out.append(
            f"rl_config.recompute_old_log_prob: in_update with epochs {alg.epochs}: a later "
            "epoch's first mini-batch needs the old log-probs its first forward no longer "
            "gives; use always (or epochs 1)"
        )
    out.extend(_kl_problems(run))
    if not run.rollout_on_servers:  # a server's engine is checked when the run connects
        out.extend(_engine_problems(run))
    return out


def _engine_problems(run: RunConfig) -> list[str]:
    """The run's own rollout engines against the prompts and the actor's devices."""
    alg, gen = run.rl.algorithm, run.generate
    out = []
    if alg.max_prompt_length + gen.sampling_config.max_tokens > gen.max_model_len:
        out.append(
            f"generate_config.max_model_len: {gen.max_model_len} is below max_prompt_length "
            f"({alg.max_prompt_length}) + sampling_config.max_tokens "
            f"({gen.sampling_config.max_tokens})"
        )
    if gen.infer_expert_parallel_size not in (1, gen.infer_tensor_parallel_size):
        out.append(
            f"generate_config.infer_expert_parallel_size: {gen.infer_expert_parallel_size} spans "
            "vLLM data-parallel replicas (larger than infer_tensor_parallel_size "
            f"{gen.infer_tensor_parallel_size}): not built (a mindrl rollout engine is one "
            "tensor-parallel group, and vLLM's expert parallel spans that engine's ranks)"
        )
    if run.actor.num_devices % gen.infer_tensor_parallel_size:
        out.append(
            f"generate_config.infer_tensor_parallel_size: {gen.infer_tensor_parallel_size} does "
            f"not divide the actor's {run.actor.num_devices} device(s)"
        )
    engines = run.actor.num_devices // gen.infer_tensor_parallel_size
    if engines and run.actor.batch.global_batch_size % engines:
        out.append(
            f"megatron_training.global_batch_size: {run.actor.batch.global_batch_size} prompts "
            f"do not split over the {engines} rollout engine(s) (actor devices / "
            "infer_tensor_parallel_size)"
        )
    if run.rl.resources.rollout_resource is not None and gen.infer_tensor_parallel_size > 1:
        out.append(
            "generate_config.infer_tensor_parallel_size: a separate rollout group "
            "(rl_config.rollout_resource) runs infer TP 1 engines for now"
        )
    if run.actor.model.num_attention_heads % gen.infer_tensor_parallel_size:
        out.append(
            f"generate_config.infer_tensor_parallel_size: {gen.infer_tensor_parallel_size} does "
            f"not divide num_attention_heads ({run.actor.model.num_attention_heads})"
        )
    return out


def _validation_problems(run: RunConfig) -> list[str]:
    loop = run.rl.loop
    asked = [
        key
        for key, on in (
            ("val_only", loop.val_only),
            ("val_before_train", loop.val_before_train),
            (f"test_freq: {loop.test_freq}", loop.test_freq > 0),
        )
        if on
    ]
    if asked and not loop.val_data_path:
        return [
            f"rl_config.val_data_path: unset, but rl_config.{', '.join(asked)} asks for "
            "validation (a prompt store of held-out problems, e.g. ${asset:tiny_prompts_val})"
        ]
    return []


def reference_in_actor_problems(run: RunConfig) -> list[str]:
    """`reference_in_actor` needs the integrated reference (actor_config's architecture and
    layout: the snapshot has the actor's shapes); without a reference, or with the LoRA
    shared backbone (already in the actor), it changes nothing and says so."""
    res = run.rl.resources
    if not res.reference_in_actor:
        return []
    if not res.use_integrated_worker:
        return [
            "rl_config.reference_in_actor: the snapshot has the actor's shapes; it needs "
            "use_integrated_worker: true (the reference built from actor_config), not ref_config"
        ]
    if run.ref is None:
        why = "there is no reference model"
    elif run.shares_backbone:
        why = "share_backbone already holds the reference in the actor"
    else:
        return []
    warn_once("reference_in_actor", f"rl_config.reference_in_actor: no effect here ({why})")
    return []


def _reward_problems(run: RunConfig) -> list[str]:
    rw = run.rl.reward
    out = []
    if run.reward is not None and (run.reward.tp, run.reward.pp) != (1, 1):
        out.append(
            "reward_config.tensor_model_parallel_size: the reward model runs as one HF "
            "replica per device (TP = PP = 1); spread it with more devices instead"
        )
    if rw.reward_model_weight != 1.0 and not (rw.rule_reward and run.reward is not None):
        warn_once(
            "RewardConfig.reward_model_weight",
            f"rl_config.reward_model_weight: {rw.reward_model_weight} has no effect: it weighs "
            "a reward model's score against the rule rewards, and this run has not both",
        )
    if not rw.rule_reward and run.reward is None:
        out.append(
            "rl_config.rule_reward: false needs a reward model (reward_config and "
            "rl_config.reward_resource)"
        )
    if rw.rule_reward:
        if not rw.verifier_function:
            out.append("rl_config.verifier_function: empty; name at least one verifier")
        if len(rw.verifier_function) != len(rw.verifier_weight):
            out.append(
                f"rl_config.verifier_weight: {len(rw.verifier_weight)} weight(s) for "
                f"{len(rw.verifier_function)} verifier_function entries; give one weight each"
            )
        budget = rw.verifier_step_budget_s
        if budget is not None and budget < rw.verifier_timeout:
            out.append(
                f"rl_config.verifier_step_budget_s: {budget} is below verifier_timeout "
                f"({rw.verifier_timeout}); it would cut calls before their own timeout"
            )
        if 0 < rw.verifier_memory_mb < MIN_VERIFIER_MEMORY_MB:
            out.append(
                f"rl_config.verifier_memory_mb: {rw.verifier_memory_mb} is below "
                f"{MIN_VERIFIER_MEMORY_MB}; a loaded verifier worker already holds ~70-300 MB "
                "(0 = no cap)"
            )
        from mindrl.rewards.registry import (
            load_verifier_file,
            unsupported_verifier_reason,
            verifier_names,
        )

        for i, path in enumerate(rw.verifier_files):
            try:
                load_verifier_file(path)
            except FileNotFoundError:
                out.append(f"rl_config.verifier_files[{i}]: file not found: {path}")
            except Exception as exc:  # a user file that fails to import
                out.append(f"rl_config.verifier_files[{i}]: {path} failed to import: {exc!r}")
        known = verifier_names()
        for i, name in enumerate(rw.verifier_function):
            if name not in known:
                reason = unsupported_verifier_reason(name)
                if reason is not None:
                    out.append(f"rl_config.verifier_function[{i}]: {name!r} {reason}")
                    continue
                from mindrl.config.fields import suggest

                out.append(
                    f"rl_config.verifier_function[{i}]: {name!r} is not a registered verifier "
                    f"(registered: {known})" + suggest(name, known)
                )
    return out


def _path_problems(run: RunConfig, *, required: bool = True, local: bool = True) -> list[str]:
    """`required`: input paths the config must name (a config error wherever it is checked).
    `local`: named input paths missing on this machine (an error for a run that starts here;
    a dry run only warns: they may exist on the cluster the config is meant for)."""
    out = []
    derived_ref = run.rl.resources.use_integrated_worker  # its paths are the actor's
    for role in run.roles:
        if role.role == "ref" and derived_ref:
            continue
        sec = ROLE_NAMES[role.role]
        tok = role.data.tokenizer_name_or_path
        if tok is None:
            if required:
                out.append(
                    f"{sec}.tokenizer_name_or_path: required (an HF model or tokenizer folder)"
                )
        elif local and not Path(tok).exists():
            out.append(f"{sec}.tokenizer_name_or_path: path does not exist: {tok}")
        load = role.ckpt.load
        if load is None and role.role != "actor":
            if required:
                out.append(
                    f"{sec}.load: required for the {role.role} model (megatron or HF folder)"
                )
        elif local and load is not None and not Path(load).exists():
            out.append(f"{sec}.load: path does not exist: {load}")
    data = run.actor.data.data_path
    if data is None:
        if required:
            out.append("megatron_training.data_path: required (output of cli/preprocess_data.py)")
    elif local and not (Path(data).exists() or any(Path(data).parent.glob(Path(data).name + "*"))):
        out.append(f"megatron_training.data_path: no dataset at {data}")
    if local and run.rl.loop.val_data_path and not Path(run.rl.loop.val_data_path).exists():
        out.append(f"rl_config.val_data_path: path does not exist: {run.rl.loop.val_data_path}")
    return out


def required_path_problems(run: RunConfig) -> list[str]:
    """Input paths the config leaves unset but must name: errors, in a dry run too."""
    return _path_problems(run, local=False)


def missing_path_problems(run: RunConfig) -> list[str]:
    """Named input paths (tokenizer, load, data) missing on this machine: errors for a real
    run, warnings for a dry run (which may be planning for another cluster)."""
    return _path_problems(run, required=False)


def output_path_problems(run: RunConfig) -> list[str]:
    """Output folders this machine certainly cannot create (see `_output_problems`)."""
    return _output_problems(run)


def _output_problems(run: RunConfig) -> list[str]:
    """Output folders whose creation would certainly fail here (under a file, no permission)."""
    out = []
    key = "runtime.output_dir" + ("" if run.runtime.output_dir else " (default)")
    reason = unwritable_reason(run.output_dir)
    if reason:
        out.append(f"{key}: {reason}")
    for role in run.roles:
        save = role.ckpt.save
        reason = unwritable_reason(save) if save else None
        if reason:
            out.append(f"{ROLE_NAMES[role.role]}.save: {reason}")
    return out


def warn_host_heap_threshold(run: RunConfig) -> None:
    """`runtime.release_memory_min_mb` is about glibc's heap: on npu / cuda a pass's memory is
    the caching allocator's, given back whole (`release_memory_after_pass`)."""
    acc = run.runtime.accelerator
    field = next(f for f in dataclasses.fields(run.runtime) if f.name == "release_memory_min_mb")
    if acc in ("npu", "cuda") and not is_default(field, run.runtime.release_memory_min_mb):
        warn_once(
            "runtime.release_memory_min_mb",
            f"runtime.release_memory_min_mb has no effect on {acc}: it keeps a small free host "
            "heap between passes on cpu; a device's cached blocks are always given back",
        )


def cross_field_problems(
    run: RunConfig, *, check_paths: bool = True, local_paths: bool = True
) -> list[str]:
    """Every cross-field problem of `run` (empty when the config is consistent).

    `local_paths=False` (a dry run): named input paths missing here are left out (report them
    with `missing_path_problems` as warnings); unset ones and unwritable outputs stay in."""
    out: list[str] = []
    res = run.rl.resources
    keys = {
        "actor": "actor_resource",
        "ref": "reference_resource",
        "reward": "reward_resource",
        "critic": "critic_resource",
        "teacher": "teacher_resource",
    }
    for role in run.roles:
        key = keys[role.role]
        if role.role == "teacher" and res.teacher_resource is None:
            key = "actor_resource"  # colocate_all_models: the actor's devices
        if role.role == "ref" and res.reference_resource is None:
            key = "actor_resource"
        if role.role == "critic" and res.critic_resource is None:
            key = "actor_resource"  # colocate_all_models: the actor's devices
        out.extend(_role_layout_problems(role, key))
    if run.actor.data.stage != DPO:  # offline DPO: no rollout, no RL algorithm
        out.extend(_batch_problems(run))
        out.extend(_algorithm_problems(run))
    out.extend(dapo_problems(run))
    out.extend(dpo_problems(run))
    out.extend(ppo_problems(run))
    out.extend(lora_problems(run))
    out.extend(packing_problems(run))
    out.extend(pipeline_problems(run))
    out.extend(partial_rollout_problems(run))
    out.extend(rollout_correction_problems(run))
    out.extend(multi_turn_problems(run, check_paths=check_paths and local_paths))
    out.extend(server_problems(run))
    out.extend(_validation_problems(run))
    out.extend(reference_in_actor_problems(run))
    out.extend(_reward_problems(run))
    warn_host_heap_threshold(run)
    if check_paths:
        out.extend(_path_problems(run, local=local_paths))
        out.extend(_output_problems(run))
    return out


def validate(run: RunConfig, *, check_paths: bool = True, local_paths: bool = True) -> RunConfig:
    """Raise ConfigError naming every cross-field problem; return `run` when consistent."""
    problems = cross_field_problems(run, check_paths=check_paths, local_paths=local_paths)
    if problems:
        raise ConfigError(problems)
    return run
