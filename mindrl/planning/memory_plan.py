"""The memory plan a run is checked against before anything starts, and how it is printed.

`plan_memory(run, backend)` predicts, per role and per device, the peak bytes of each phase
of a step -- parameters, fp32 gradients, optimizer state, activations, the loss over the
vocabulary, the rollout engine's weights and KV cache, minus what is offloaded -- and holds
the worst device of every device group (on CPU: the host's sum) against the device's memory
(`runtime.device_memory_gb`, else 64 GiB on Ascend 910B, 80 GiB on H100, the host's RAM on
CPU). A group that does not fit is a problem naming the role, the bytes and the knobs that
make it fit (found by re-planning, `knobs.py`) when what does not depend on the samples'
lengths (parameters, gradients, optimizer state, the engine's share) is already too much, a
warning with the same knobs when only the longest possible micro-batch's activations are
(MindSpeed-RL's own configs are sized for real lengths, not the worst case); a group above
90% of the memory left to it (the device, less the engine share vLLM was granted) is a
warning. Planning needs no hardware:
a laptop plans an NPU cluster's config.
"""

from __future__ import annotations

from dataclasses import dataclass

from mindrl.config.run import RunConfig
from mindrl.planning.engine import GIB, engine_problems
from mindrl.planning.knobs import HOST, knobs_that_fit
from mindrl.planning.phases import CorePlan, DevicePeak, Parts, Phase, RolePlan, build_plan
from mindrl.planning.shapes import ignored_settings

WARN_FRACTION = 0.9
# parts that grow with the samples' lengths: the plan takes every sample at the longest
# (max_prompt_length + max_tokens), which real batches rarely reach, so over the device
# memory through these alone is a warning; over it without them is a refusal
LENGTH_BOUND = ("activations", "logits", "masks")
MAX_KNOBS_SHOWN = 4
ENGINE_NAMES = {"vllm": "vLLM", "hf": "HF engine"}


@dataclass(frozen=True)
class MemoryPlan:
    core: CorePlan
    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    ignored: tuple[str, ...]

    def describe(self) -> str:
        return "\n".join(_lines(self))


def _gib(b: float) -> str:
    return f"{b / GIB:.1f}"


def _parts(parts: Parts, notes: dict[str, str] | None = None) -> str:
    """`params 2.0 GiB + grads 4.1 + ...`: parts under 0.05 GiB left out (not the params,
    kept and engine parts: which engine is planned is worth a line), `notes` after a part's
    number."""
    notes = notes or {}
    shown = [(n, b) for n, b in parts if b >= 0.05 * GIB or n in ("params", "kept", "engine")]
    if not shown:
        return "0.0 GiB"
    texts = []
    for i, (name, b) in enumerate(shown):
        unit = " GiB" if i == 0 else ""
        note = f" ({notes[name]})" if name in notes else ""
        texts.append(f"{name} {_gib(b)}{unit}{note}")
    return " + ".join(texts)


def _phase(phase: Phase, notes: dict[str, str]) -> str:
    return f"{_parts(phase.parts, notes)} = {_gib(phase.total)} GiB {phase.name}"


def _engine_note(plan: CorePlan) -> str:
    e = plan.engine
    if e is None:
        return ""
    kv = f"{e.kv_tokens / 1000:.0f}k tokens" if e.kv_tokens >= 1000 else f"{e.kv_tokens} tokens"
    name = ENGINE_NAMES.get(e.backend, e.backend)
    return f"{name}: weights {_gib(e.weights)} + KV cache {_gib(e.kv_cache)}, {kv}"


def _who(role: RolePlan, stage: int) -> str:
    if role.shape is None or role.shape.hf_model:
        return f"{role.role} ({role.layout})"
    where = f", stage {stage} of {role.shape.pp}" if role.shape.pp > 1 else ""
    return f"{role.role} {role.layout}{where}"


def _role_line(plan: CorePlan, role: RolePlan) -> str:
    rank = role.worst
    notes = {"engine": _engine_note(plan), **dict(rank.notes)}
    phases = "; ".join(_phase(p, notes) for p in rank.phases)
    peak = rank.peak.total
    if plan.backend == "cpu":
        tail = f"peak {_gib(peak)} GiB per process"
    else:
        tail = f"peak {_gib(peak)} / {plan.device.gib:.1f} GiB ({peak / plan.device.bytes:.0%})"
    return f"  {_who(role, rank.stage)} ({role.num_devices} device(s)): {phases}; {tail}"


def _shared_line(plan: CorePlan, peak: DevicePeak) -> str:
    waiting = " + ".join(f"{n} {_gib(b)}" for n, b in peak.waiting if b >= 0.05 * GIB)
    return (
        f"  {peak.group} share {peak.num_devices} device(s): peak {_gib(peak.total)} / "
        f"{plan.device.gib:.1f} GiB ({peak.total / plan.device.bytes:.0%}) during {peak.worker} "
        f"{peak.phase.name}: {_gib(peak.phase.total)}" + (f" + {waiting}" if waiting else "")
    )


def _header(plan: CorePlan) -> str:
    dev = plan.device
    if plan.backend == "cpu":
        return f"memory plan (CPU: every worker process shares {dev.source}, {dev.gib:.1f} GiB):"
    kind = {"npu": "NPU", "cuda": "GPU"}[plan.backend]
    hint = "" if dev.source == "runtime.device_memory_gb" else "; runtime.device_memory_gb sets it"
    return f"memory plan (per device: {kind} {dev.gib:.1f} GiB, {dev.source}{hint}):"


def _lines(mp: MemoryPlan) -> list[str]:
    plan = mp.core
    lines = [_header(plan), f"  {plan.lengths.describe()}"]
    lines.extend(_role_line(plan, role) for role in plan.roles)
    if plan.backend == "cpu":
        model = plan.host_total
        lines.append(
            f"  host: {plan.processes} worker process(es), {_gib(model)} / "
            f"{plan.device.gib:.1f} GiB ({model / plan.device.bytes:.0%}) with their "
            "interpreters and imports"
        )
    else:
        lines.extend(_shared_line(plan, p) for p in plan.peaks if len(p.roles) > 1)
    if mp.ignored:
        lines.append(f"  not counted (no effect here): {', '.join(mp.ignored)}")
    return lines


def _role(plan: CorePlan, name: str) -> RolePlan:
    return next(r for r in plan.roles if r.role == name)


def _knob_text(run: RunConfig, plan: CorePlan, target: str, roles: tuple[str, ...]) -> str:
    knobs = knobs_that_fit(run, plan, target, roles)
    if not knobs:
        return (
            "no knob found that makes it fit on these devices: more devices "
            "(rl_config.*_resource) or a larger runtime.device_memory_gb"
        )
    shown = [f"{k.describe()} ({_gib(k.peak)} GiB)" for k in knobs[:MAX_KNOBS_SHOWN]]
    how = "fits with" if len(knobs[0].overrides) == 1 or len(knobs) > 1 else "fits with all of"
    return f"{how}: " + "; or ".join(shown)


def _group_who(plan: CorePlan, peak: DevicePeak) -> str:
    role = _role(plan, peak.worker)
    stage = next(r.stage for r in role.ranks if r.phases and peak.phase in r.phases)
    who = _who(role, stage)
    if len(peak.roles) > 1:
        who += f" sharing its device(s) with {', '.join(r for r in peak.roles if r != peak.worker)}"
    return who


def _device_checks(run: RunConfig, plan: CorePlan) -> tuple[list[str], list[str]]:
    problems, warnings = [], []
    limit = plan.device.bytes
    for peak in plan.peaks:
        who = _group_who(plan, peak)
        parts = _parts(peak.phase.parts + peak.waiting)
        if peak.total > limit:
            fixed = sum(b for n, b in peak.phase.parts + peak.waiting if n not in LENGTH_BOUND)
            if fixed > limit:
                problems.append(
                    f"memory plan: {who} needs {_gib(peak.total)} GiB per device in the "
                    f"{peak.phase.name} phase ({parts}), more than the {plan.device.gib:.1f} "
                    f"GiB of a device ({plan.device.source}); "
                    + _knob_text(run, plan, peak.group, peak.roles)
                )
            else:
                warnings.append(
                    f"memory plan: {who} may run out of memory on long samples: "
                    f"{_gib(peak.total)} GiB per device in the {peak.phase.name} phase when "
                    f"every sample of a micro-batch has the longest length ({parts}), more "
                    f"than the {plan.device.gib:.1f} GiB of a device ({plan.device.source}); "
                    f"without activations {_gib(fixed)} GiB; "
                    + _knob_text(run, plan, peak.group, peak.roles)
                )
            continue
        granted = dict(peak.phase.parts).get("engine", 0.0) if plan.engine else 0.0
        if plan.engine is not None and not plan.engine.sleeps:
            granted = 0.0
        if peak.total - granted > WARN_FRACTION * (limit - granted):
            problems_free = (limit - peak.total) / GIB
            warnings.append(
                f"memory plan: {who} peaks at {_gib(peak.total)} / {plan.device.gib:.1f} GiB "
                f"per device in the {peak.phase.name} phase ({parts}); {problems_free:.1f} GiB "
                "left for allocator fragmentation and communication buffers"
            )
    if plan.hybrid and plan.engine is not None and plan.engine.sleeps:
        if plan.engine_start > limit:
            warnings.append(
                "memory plan: the hybrid engine starts while the actor's parameters, gradients "
                f"and fp32 master weights are on the device: with the engine's share that is "
                f"{_gib(plan.engine_start)} / {plan.device.gib:.1f} GiB, and vLLM refuses to "
                "start when free memory is below gpu_memory_utilization x device memory"
            )
    return problems, warnings


def _host_checks(run: RunConfig, plan: CorePlan) -> tuple[list[str], list[str]]:
    total, limit = plan.host_total, plan.device.bytes
    biggest = max(plan.roles, key=lambda r: r.worst.peak.total * r.num_devices)
    if total > limit:
        roles = tuple(r.role for r in plan.roles)
        return [
            f"memory plan: the {plan.processes} worker process(es) need {_gib(total)} GiB, "
            f"more than the {plan.device.gib:.1f} GiB of {plan.device.source} (largest: "
            f"{biggest.role}, {_gib(biggest.worst.peak.total)} GiB per process); "
            + _knob_text(run, plan, HOST, roles)
        ], []
    if total > WARN_FRACTION * limit:
        return [], [
            f"memory plan: the worker processes need {_gib(total)} / {plan.device.gib:.1f} "
            f"GiB of {plan.device.source} ({total / limit:.0%})"
        ]
    return [], []


def plan_memory(run: RunConfig, backend: str) -> MemoryPlan:
    """The memory plan of `run` on `backend` ("npu" | "cuda" | "cpu"), with its problems
    (a group that does not fit, an engine that cannot start) and warnings."""
    plan = build_plan(run, backend)
    problems: list[str] = []
    if plan.engine is not None:
        problems.extend(engine_problems(plan.engine, run.generate, "memory plan"))
    if backend == "cpu":
        more, warnings = _host_checks(run, plan)
    else:
        more, warnings = _device_checks(run, plan)
    problems.extend(more)
    if plan.engine is not None:  # what the engine builder will say about its choice
        problems.extend([plan.engine.refusal] if plan.engine.refusal else [])
        warnings.extend([plan.engine.warning] if plan.engine.warning else [])
    return MemoryPlan(plan, tuple(problems), tuple(warnings), tuple(ignored_settings(run, backend)))
