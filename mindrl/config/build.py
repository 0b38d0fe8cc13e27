"""Raw composed YAML (plain dicts) -> typed, frozen `RunConfig`.

Role sections are merged as MindSpeed-RL does: the chosen model's architecture, then
`megatron_training`, then the role's own section, so role keys win over shared ones and shared
ones over the model file. Every problem found is collected and raised together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mindrl.config.dapo import DAPO, dapo_rl
from mindrl.config.dpo import DPO, dpo_reference, dpo_sections, is_dpo
from mindrl.config.errors import ConfigError
from mindrl.config.fates import SECTION_FATES, section_fate, warn_once
from mindrl.config.fields import _Problems, build_dataclass, build_groups, suggest
from mindrl.config.generate import GenerateConfig
from mindrl.config.generation import (
    as_1x_rl_section,
    generation_line,
    read_generation,
    settle_mini_batch_reading,
)
from mindrl.config.model_family import infer_family
from mindrl.config.pipeline import with_pipeline_defaults
from mindrl.config.ppo import PPO
from mindrl.config.profiler import ProfilerConfig
from mindrl.config.rl import RL_GROUPS, RLConfig
from mindrl.config.role import ROLE_GROUPS, ROLE_NAMES, RoleConfig
from mindrl.config.run import RunConfig, RuntimeConfig

TOP_LEVEL_KEYS = (
    "model",
    "megatron_training",
    "actor_config",
    "ref_config",
    "reward_config",
    "critic_config",
    "teacher_config",
    "rl_config",
    "generate_config",
    "runtime",
    "profiler_config",
)


def _section(raw: Mapping[str, Any], key: str, problems: _Problems) -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.add(f"{key}: expected a mapping, got {type(value).__name__}")
        return {}
    return dict(value)


def _pick_model(
    raw: Mapping[str, Any],
    shared: Mapping[str, Any],
    section: str,
    own: Mapping[str, Any],
    problems: _Problems,
) -> tuple[str, dict[str, Any]] | None:
    models = _section(raw, "model", problems)
    name = own.get("model", shared.get("model"))
    if name is None:
        if len(models) == 1:
            name = next(iter(models))
        else:
            problems.add(
                f"{section}.model: required (configured models: {sorted(models) or 'none'}; "
                "add one under defaults: - model: NAME)"
            )
            return None
    if name not in models:
        where = f"{section}.model" if "model" in own else "megatron_training.model"
        problems.add(
            f"{where}: model {name!r} is not loaded (loaded: {sorted(models)}); list it under "
            "defaults: - model:" + suggest(str(name), map(str, models))
        )
        return None
    arch = models[name]
    if not isinstance(arch, Mapping):
        problems.add(f"model.{name}: expected a mapping of architecture keys")
        return None
    return str(name), dict(arch)


def _build_role(
    raw: Mapping[str, Any],
    role: str,
    num_devices: int,
    problems: _Problems,
    notes: list[str] | None = None,
) -> RoleConfig | None:
    section = ROLE_NAMES[role]
    shared = _section(raw, "megatron_training", problems)
    own = _section(raw, section, problems)
    picked = _pick_model(raw, shared, section, own, problems)
    if picked is None:
        return None
    model_name, arch = picked
    flat: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for src, values in (
        (f"model.{model_name}", arch),
        ("megatron_training", shared),
        (section, own),
    ):
        for key, value in values.items():
            if key == "model":
                continue
            flat[str(key)] = value
            origin[str(key)] = src
    flat.setdefault("name", model_name)
    decision = infer_family(flat, [flat.get("load"), flat.get("tokenizer_name_or_path")])
    if decision.refusal:  # one line, not a list of the family's unknown keys
        problems.add(f"model.{model_name}: {decision.refusal}")
        return None
    flat = decision.arch_section(flat)
    for key in ("model_type_hf", "add_qkv_bias"):
        origin.setdefault(key, f"model.{model_name}")
    if notes is not None:
        notes.append(f"{section}: {decision.describe()}")
    groups = build_groups(ROLE_GROUPS, flat, section, problems, origin)
    if any(v is None for v in groups.values()):
        return None
    return RoleConfig(role=role, num_devices=num_devices, **groups)


def build_run_config(raw: Mapping[str, Any], config_name: str) -> RunConfig:
    """Type-check and group a composed config; raise ConfigError listing every problem
    (all sections are checked in one pass, so a bad key in one does not hide the others)."""
    problems = _Problems()
    notes: list[str] = []
    if is_dpo(raw):
        raw = dpo_sections(raw, notes)
    for key in raw:
        if key in SECTION_FATES:  # MindSpeed-RL sections mindrl does not build
            refusal = section_fate(str(key), raw[key])
            if refusal:
                problems.add(refusal)
            continue
        if key not in TOP_LEVEL_KEYS:
            problems.add(f"{key}: unknown top-level section" + suggest(str(key), TOP_LEVEL_KEYS))
    if raw.get("actor_config") is None:
        problems.add("actor_config: required section is missing")

    generation = read_generation(raw)
    rl_section = _section(raw, "rl_config", problems)
    unit_given = "mini_batch_size_unit" in rl_section
    if generation.is_1x:
        rl_section, changes = as_1x_rl_section(rl_section)
        notes.append(generation_line(generation, changes))
    rl_groups = build_groups(RL_GROUPS, rl_section, "rl_config", problems)
    generate = build_dataclass(
        GenerateConfig, _section(raw, "generate_config", problems), "generate_config", problems
    )
    runtime = build_dataclass(
        RuntimeConfig, _section(raw, "runtime", problems), "runtime", problems
    )
    profiler = _build_profiler(_section(raw, "profiler_config", problems), problems)
    # a broken group still lets the roles be checked, against its defaults
    rl = RLConfig(**{k: v if v is not None else RL_GROUPS[k]() for k, v in rl_groups.items()})
    res = rl.resources

    rl = with_pipeline_defaults(rl, rl_section, notes)
    actor = _build_role(raw, "actor", res.actor_resource.num_npus, problems, notes)
    ref = reward = None
    dapo = actor is not None and actor.data.stage == DAPO
    if dapo:  # MindSpeed-RL's DAPO trainer: its loss settings, no reference model
        rl = dapo_rl(rl)
    if dapo and raw.get("ref_config") is not None:
        warn_once(
            "dapo.ref_config",
            "ref_config: no effect with stage ray_dapo (MindSpeed-RL's DAPO trainer has no "
            "reference model)",
        )
    elif res.use_integrated_worker:
        _refuse_separate_roles(raw, res, problems)
        if actor is not None and rl.algorithm.kl.where != "off":
            ref = dataclasses.replace(actor, role="ref")  # MindSpeed-RL's integrated reference
    elif raw.get("ref_config") is not None:
        ref_devices = _role_devices("ref", res.reference_resource, res, problems)
        ref = _build_role(raw, "ref", ref_devices, problems, notes)
    elif res.reference_resource is not None:
        problems.add("rl_config.reference_resource: set, but there is no ref_config section")
    if res.reward_resource is not None and not res.use_integrated_worker:
        if raw.get("reward_config") is None:
            problems.add("rl_config.reward_resource: set, but there is no reward_config section")
        else:
            reward = _build_role(raw, "reward", res.reward_resource.num_npus, problems)
    if actor is not None and actor.data.stage == DPO:
        ref = dpo_reference(actor)
    critic = _build_critic(raw, actor, res, problems, notes)
    teacher = _build_teacher(raw, rl, problems, notes)
    if problems.items or generate is None or runtime is None or actor is None:
        raise ConfigError(problems.items)
    run = RunConfig(
        config_name=config_name,
        actor=actor,
        ref=ref,
        reward=reward,
        critic=critic,
        rl=rl,
        generate=generate,
        runtime=runtime,
        notes=tuple(dict.fromkeys(notes)),
        profiler=profiler or ProfilerConfig(),
        teacher=teacher,
    )
    run, reading = settle_mini_batch_reading(run, generation, unit_given)
    if reading:
        run = dataclasses.replace(run, notes=(*run.notes, reading))
    return run


def _build_profiler(section: Mapping[str, Any], problems: _Problems) -> ProfilerConfig | None:
    """`profiler_config.integrated`, the only part MindSpeed-RL reads."""
    for key in section:
        if key != "integrated":
            problems.add(
                f"profiler_config.{key}: unknown; MindSpeed-RL (and mindrl) read only "
                "profiler_config.integrated" + suggest(str(key), ["integrated"])
            )
    integrated = section.get("integrated") or {}
    if not isinstance(integrated, Mapping):
        problems.add("profiler_config.integrated: expected a mapping")
        return None
    return build_dataclass(ProfilerConfig, integrated, "profiler_config.integrated", problems)


def _build_critic(
    raw: Mapping[str, Any],
    actor: RoleConfig | None,
    res: Any,
    problems: _Problems,
    notes: list[str],
) -> RoleConfig | None:
    """PPO's value model from critic_config (stage ray_ppo); elsewhere the section is unread."""
    if actor is None or raw.get("critic_config") is None:
        return None
    if actor.data.stage != PPO:
        warn_once(
            "critic_config",
            f"critic_config: no effect with stage {actor.data.stage}: only PPO trains a "
            "critic (megatron_training.stage: ray_ppo)",
        )
        return None
    if res.critic_resource is not None:
        devices = int(res.critic_resource.num_npus)
    elif res.colocate_all_models:
        devices = int(res.actor_resource.num_npus)
    else:
        problems.add(
            "rl_config.critic_resource: required for critic_config (or set "
            "rl_config.colocate_all_models: true to share the actor's devices)"
        )
        return None
    return _build_role(raw, "critic", devices, problems, notes)


def _build_teacher(
    raw: Mapping[str, Any], rl: RLConfig, problems: _Problems, notes: list[str]
) -> RoleConfig | None:
    """On-policy distillation's teacher from teacher_config (rl_config.use_opd): its own
    model (`teacher_config.model`, another family or size is fine) and checkpoint (`load`)."""
    res = rl.resources
    if not rl.distillation.use_opd:
        if raw.get("teacher_config") is not None or res.teacher_resource is not None:
            warn_once(
                "teacher_config",
                "teacher_config / rl_config.teacher_resource: no effect without "
                "rl_config.use_opd: true (only on-policy distillation reads a teacher)",
            )
        return None
    if raw.get("teacher_config") is None:
        problems.add(
            "rl_config.use_opd: on-policy distillation needs a teacher_config section (the "
            "teacher's model and load path)"
        )
        return None
    if res.teacher_resource is not None:
        devices = int(res.teacher_resource.num_npus)
    elif res.colocate_all_models:
        devices = int(res.actor_resource.num_npus)
    else:
        problems.add(
            "rl_config.teacher_resource: required for teacher_config (or set "
            "rl_config.colocate_all_models: true to share the actor's devices)"
        )
        return None
    return _build_role(raw, "teacher", devices, problems, notes)


def _refuse_separate_roles(raw: Mapping[str, Any], res: Any, problems: _Problems) -> None:
    """MindSpeed-RL's integrated worker holds actor, reference and rollout: it refuses a
    separate reference or reward model, and so does mindrl (same meaning, same config)."""
    why = "with use_integrated_worker: true the reference is built from actor_config"
    if raw.get("ref_config") is not None:
        problems.add(
            f"ref_config: not allowed ({why}); remove it or set use_integrated_worker: false"
        )
    if res.reference_resource is not None:
        problems.add(
            f"rl_config.reference_resource: not allowed ({why} and shares the actor's devices)"
        )
    if res.reward_resource is not None or raw.get("reward_config") is not None:
        problems.add(
            "rl_config.reward_resource: a reward model is not supported with "
            "use_integrated_worker: true (as in MindSpeed-RL); set use_integrated_worker: false"
        )


def _role_devices(role: str, spec: Any, res: Any, problems: _Problems) -> int:
    if spec is not None:
        return int(spec.num_npus)
    if res.colocate_actor_ref or res.colocate_all_models:
        return int(res.actor_resource.num_npus)
    problems.add(
        "rl_config.reference_resource: required for ref_config (or set "
        "rl_config.colocate_actor_ref: true to share the actor's devices)"
    )
    return 1
