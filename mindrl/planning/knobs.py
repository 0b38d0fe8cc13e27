"""Which config knobs make a device group (or, on CPU, the host) fit: found by re-planning.

Each candidate is the run with one knob changed -- a higher TP or PP on the same devices, the
distributed optimizer, full recompute, sequence parallelism, offloading the training state
during rollout, a smaller gpu_memory_utilization or micro_batch_size -- kept only when the
changed config passes the same cross-field validation a real run does and its re-planned
peak fits. When no single knob is enough, knobs are added greedily (the one that lowers the
peak most, then the next) until it fits. A knob whose key is not built yet changes nothing in
the plan (see `shapes.effective`), so it is never suggested.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mindrl.config.role import RoleConfig
from mindrl.config.run import RunConfig
from mindrl.config.validate import cross_field_problems
from mindrl.planning.engine import engine_problems
from mindrl.planning.phases import CorePlan, build_plan

HOST = "host"
MAX_COMBINED = 4


@dataclass(frozen=True)
class Knob:
    """A change as Hydra overrides, and the re-planned peak it gives the target."""

    overrides: tuple[str, ...]
    peak: float

    def describe(self) -> str:
        return " ".join(self.overrides)


def target_bytes(plan: CorePlan, target: str) -> float:
    """The target's planned bytes: a device group's worst device, or the host's total."""
    if target == HOST:
        return plan.host_total
    peak = plan.peak_of(target)
    return peak.total if peak is not None else 0.0


def _section(run: RunConfig, role: str) -> str:
    if role == "ref" and run.rl.resources.use_integrated_worker:
        return "actor_config"  # the integrated reference is built from actor_config
    from mindrl.config.role import ROLE_NAMES

    return ROLE_NAMES[role]


def _with_role(run: RunConfig, role: str, group: str, **changes: Any) -> RunConfig:
    """`run` with fields of one group of a role changed (the integrated reference follows
    the actor, as it is built from actor_config)."""
    integrated = run.rl.resources.use_integrated_worker
    names = {"actor", "ref"} if integrated and role in ("actor", "ref") else {role}
    updates: dict[str, Any] = {}  # role name -> its changed RoleConfig
    for name in names:
        cfg: RoleConfig | None = getattr(run, name)
        if cfg is not None:
            new_group = dataclasses.replace(getattr(cfg, group), **changes)
            updates[name] = dataclasses.replace(cfg, **{group: new_group})
    return dataclasses.replace(run, **updates)


def _with_generate(run: RunConfig, **changes: Any) -> RunConfig:
    return dataclasses.replace(run, generate=dataclasses.replace(run.generate, **changes))


def _shown(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


Candidate = tuple[tuple[str, ...], RunConfig]


def _role_candidates(run: RunConfig, role: RoleConfig, plan: CorePlan) -> Iterator[Candidate]:
    sec = _section(run, role.role)
    shape = next(p.shape for p in plan.roles if p.role == role.role)

    def one(group: str, **changes: object) -> Candidate:
        ov = tuple(f"{sec}.{k}={_shown(v)}" for k, v in changes.items())
        return ov, _with_role(run, role.role, group, **changes)

    if role.role != "reward":  # the HF reward model runs at TP = PP = 1
        for tp in range(role.tp + 1, role.num_devices + 1):
            yield one("parallel", tensor_model_parallel_size=tp)
        for pp in range(role.pp + 1, role.num_devices + 1):
            yield one("parallel", pipeline_model_parallel_size=pp)
        if shape is not None and role.tp > 1 and not shape.sequence_parallel:
            yield one("parallel", sequence_parallel=True)
    if role.role == "actor" and shape is not None:
        if shape.dp > 1 and not shape.distributed_optimizer:
            yield one("parallel", use_distributed_optimizer=True)
        if shape.recompute.granularity != "full":
            yield one(
                "memory",
                recompute_granularity="full",
                recompute_method="uniform",
                recompute_num_layers=1,
            )
    for mbs in range(role.batch.micro_batch_size - 1, 0, -1):
        yield one("batch", micro_batch_size=mbs)


def _engine_candidates(run: RunConfig, plan: CorePlan) -> Iterator[Candidate]:
    gen = run.generate
    if plan.engine is None or not plan.engine.sleeps or plan.backend == "cpu":
        return  # on CPU neither the offloads nor the memory share change anything
    if plan.hybrid:
        off = {
            "offload_train_param": gen.offload_train_param,
            "offload_train_grad": gen.offload_train_grad,
            "offload_train_optimizer": gen.offload_train_optimizer,
        }
        unset = {k: True for k, v in off.items() if not v}
        if unset:
            ov = tuple(f"generate_config.{k}=true" for k in unset)
            yield ov, _with_generate(run, **unset)
    util = round(gen.gpu_memory_utilization - 0.05, 2)
    while util > 0.04:
        yield (
            (f"generate_config.gpu_memory_utilization={util:g}",),
            _with_generate(run, gpu_memory_utilization=util),
        )
        util = round(util - 0.05, 2)


def candidates(run: RunConfig, plan: CorePlan, roles: tuple[str, ...]) -> Iterator[Candidate]:
    """Every single-knob change of the roles in `roles` (and of their rollout engine)."""
    for role in run.roles:
        if role.role in roles:
            yield from _role_candidates(run, role, plan)
    if "actor" in roles or "rollout" in roles:
        yield from _engine_candidates(run, plan)


def _replan(run: RunConfig, backend: str) -> CorePlan | None:
    """The plan of a changed config, or None when a real run would refuse it."""
    if cross_field_problems(run, check_paths=False):
        return None
    plan = build_plan(run, backend)
    if plan.engine is not None and engine_problems(plan.engine, run.generate, "engine"):
        return None
    return plan


def knobs_that_fit(
    run: RunConfig, plan: CorePlan, target: str, roles: tuple[str, ...]
) -> list[Knob]:
    """Single knobs that make `target` fit the device, each at its mildest setting (the
    smallest TP / PP, the largest micro-batch or memory share that fits); else one greedy
    combination; else nothing."""
    limit = plan.device.bytes
    fits: dict[str, Knob] = {}  # per key: the first (mildest) setting that fits
    scored: list[tuple[float, Candidate]] = []
    for overrides, changed in candidates(run, plan, roles):
        key = overrides[0].split("=")[0]
        new = _replan(changed, plan.backend)
        if new is None:
            continue
        peak = target_bytes(new, target)
        scored.append((peak, (overrides, changed)))
        if peak <= limit and key not in fits:
            fits[key] = Knob(overrides, peak)
    if fits:
        return list(fits.values())
    return _greedy(run, plan, target, roles, scored)


def _merged(applied: tuple[str, ...], more: tuple[str, ...]) -> tuple[str, ...]:
    """Overrides in order, a later value of a key replacing the earlier one."""
    out = {o.split("=")[0]: o for o in applied}
    out.update({o.split("=")[0]: o for o in more})
    return tuple(out.values())


def _greedy(
    run: RunConfig,
    plan: CorePlan,
    target: str,
    roles: tuple[str, ...],
    scored: list[tuple[float, Candidate]],
) -> list[Knob]:
    limit = plan.device.bytes
    applied: tuple[str, ...] = ()
    best = target_bytes(plan, target)
    for _ in range(MAX_COMBINED):
        if not scored:
            return []
        peak, (overrides, changed) = min(scored, key=lambda s: s[0])
        if peak >= best:
            return []
        run, best, applied = changed, peak, _merged(applied, overrides)
        if peak <= limit:
            return [Knob(applied, peak)]
        current = build_plan(run, plan.backend)
        scored = []
        for ov, cand in candidates(run, current, roles):
            new = _replan(cand, plan.backend)
            if new is not None:
                scored.append((target_bytes(new, target), (ov, cand)))
    return []
