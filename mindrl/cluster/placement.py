"""Roles -> device groups -> Ray placement-group bundles, decided before anything starts.

Pure planning (no Ray import): the plan is validated against the cluster's resources and can be
printed by `--dry-run`. Colocated roles share one device group (and so one placement group);
`colocate_all_models` puts actor, reference and reward on the same devices,
`colocate_actor_ref` (and MindSpeed-RL's integrated worker, `use_integrated_worker: true`) the
actor and reference. With `rl_config.rollout_resource` the rollout engines get their own group
of that many devices; otherwise every actor rank holds one (the hybrid engine).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mindrl.config.role import RoleConfig
from mindrl.config.run import RunConfig


@dataclass(frozen=True)
class RoleLayout:
    role: str
    num_devices: int
    tp: int
    pp: int
    dp: int
    ep: int = 1  # expert_model_parallel_size (MoE)
    layers: str = ""  # uneven stages / noop layers (`LayerLayout.describe`); "" for the even split
    cp: int = 1  # context_parallel_size: each sequence split over CP ranks

    @property
    def expert_dp(self) -> int:
        """megatron's expert data-parallel size, DP / EP (experts split over TP like the dense
        layers: expert_tensor_parallel_size = TP); 0 when EP does not divide DP."""
        return self.dp // self.ep if self.dp % self.ep == 0 else 0

    def describe(self) -> str:
        """`actor    devices=2 TP=1 PP=1 DP=2`, with `CP=2` for context parallel and `EP=2
        expert-DP=1` for expert parallel."""
        line = f"{self.role:<8} devices={self.num_devices} TP={self.tp} PP={self.pp}"
        line += f" CP={self.cp}" if self.cp > 1 else ""
        line += f" DP={self.dp}"
        line += f" EP={self.ep} expert-DP={self.expert_dp}" if self.ep > 1 else ""
        return line + (f" ({self.layers})" if self.layers else "")


@dataclass(frozen=True)
class DeviceGroup:
    """One placement group: devices shared by the roles listed (colocation)."""

    name: str
    roles: tuple[RoleLayout, ...]
    num_devices: int
    bundle: dict[str, float]
    strategy: str  # "STRICT_PACK" (one node) or "PACK" (may span nodes)


@dataclass(frozen=True)
class ClusterResources:
    """Per-node resources as Ray reports them (`ray.nodes()[i]["Resources"]`)."""

    nodes: tuple[dict[str, float], ...]

    def total(self, resource: str) -> float:
        return sum(n.get(resource, 0.0) for n in self.nodes)

    def max_per_node(self, resource: str) -> float:
        return max((n.get(resource, 0.0) for n in self.nodes), default=0.0)


@dataclass(frozen=True)
class PlacementPlan:
    resource: str  # "NPU" | "GPU" | "CPU"
    groups: tuple[DeviceGroup, ...] = field(default_factory=tuple)

    @property
    def total_devices(self) -> int:
        return sum(g.num_devices for g in self.groups)

    def worker_processes(self) -> int:
        """Worker processes the plan starts: one per rank of each role (colocated roles are
        separate processes on the same devices)."""
        return sum(layout.num_devices for g in self.groups for layout in g.roles)

    def demand(self) -> dict[str, float]:
        """Total Ray resources the plan reserves."""
        out: dict[str, float] = {}
        for g in self.groups:
            for k, v in g.bundle.items():
                out[k] = out.get(k, 0.0) + v * g.num_devices
        return out

    def fit_problems(self, cluster: ClusterResources) -> list[str]:
        """Why the plan does not fit `cluster` (empty when it fits)."""
        out = []
        for res, need in self.demand().items():
            have = cluster.total(res)
            if need > have:
                roles = ", ".join(f"{g.name}={g.num_devices}" for g in self.groups)
                out.append(
                    f"rl_config.*_resource: the run needs {need:g} {res} ({roles}) but the "
                    f"cluster has {have:g} over {len(cluster.nodes)} node(s)"
                )
        return out

    def describe(self) -> str:
        lines = [f"placement plan ({self.resource} devices; {self.total_devices} in all):"]
        for g in self.groups:
            bundle = ", ".join(f"{k}={v:g}" for k, v in g.bundle.items())
            lines.append(
                f"  group {g.name}: {g.num_devices} device(s), {g.strategy}, bundle {{{bundle}}}"
            )
            lines.extend(f"    {r.describe()}" for r in g.roles)
        return "\n".join(lines)


def _layout(role: RoleConfig) -> RoleLayout:
    ep = role.moe.expert_model_parallel_size
    return RoleLayout(
        role.role,
        role.num_devices,
        role.tp,
        role.pp,
        role.dp,
        ep,
        role.layer_layout.describe(),
        role.cp,
    )


def plan_placement(
    run: RunConfig, resource: str, devices_per_node: float | None = None
) -> PlacementPlan:
    """Group the run's roles by colocation and size one bundle per device."""
    res = run.rl.resources
    cpus = float(res.num_cpus_for_placement_group)
    bundle = {"CPU": cpus} if resource == "CPU" else {resource: 1.0, "CPU": cpus}

    sets: list[list[RoleConfig]] = []
    if res.colocate_all_models:
        sets.append(run.roles)
    else:
        with_actor = res.colocate_actor_ref or res.use_integrated_worker
        own_ref = run.ref if run.ref is not None and not run.reference_in_actor else None
        first = [run.actor] + ([own_ref] if with_actor and own_ref is not None else [])
        sets.append(first)
        sets.extend([r] for r in run.roles if all(r is not x for x in first))
    groups = []
    for roles in sets:
        n = max(r.num_devices for r in roles)
        groups.append(
            _group(
                "+".join(r.role for r in roles),
                [_layout(r) for r in roles],
                n,
                bundle,
                devices_per_node,
            )
        )
    if res.rollout_resource is not None:
        n = res.rollout_resource.num_npus
        rollout = RoleLayout("rollout", n, n, 1, 1)
        groups.append(_group("rollout", [rollout], n, bundle, devices_per_node))
    return PlacementPlan(resource=resource, groups=tuple(groups))


def _group(
    name: str, roles: list[RoleLayout], n: int, bundle: dict[str, float], per_node: float | None
) -> DeviceGroup:
    strategy = "STRICT_PACK" if per_node is not None and n <= per_node else "PACK"
    return DeviceGroup(name, tuple(roles), n, dict(bundle), strategy)
