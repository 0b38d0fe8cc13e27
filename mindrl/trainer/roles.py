"""Start the role worker groups of a run on the placement plan's device groups.

The driver sees one `Roles` object: worker groups for the actor (with the rollout engine in
the hybrid layout) and the reference, and the placement groups they sit on. Which roles share
devices is the plan's business; the loop's code is the same for every placement.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mindrl.cluster.placement import PlacementPlan
from mindrl.config.run import RunConfig
from mindrl.trainer.worker_env import worker_env
from mindrl.workers.facades import (
    ActorGroup,
    CriticGroup,
    ReferenceGroup,
    ReferenceInActor,
    RewardModelGroup,
    RolloutGenerator,
    RolloutGroup,
    TeacherGroup,
)
from mindrl.workers.server_rollout import ServerRolloutGroup

if TYPE_CHECKING:
    from mindrl.cluster.worker_group import WorkerGroup
    from mindrl.data.tokenizer import TokenizerSource

logger = logging.getLogger("mindrl.trainer")


@dataclass
class Roles:
    """The run's role facades; `generator` is whichever of them generates."""

    actor: ActorGroup
    ref: ReferenceGroup | ReferenceInActor | None
    reward: RewardModelGroup | None  # a reward model (reward_config + reward_resource)
    rollout: RolloutGroup | ServerRolloutGroup | None  # own devices, or vLLM servers
    groups: list[WorkerGroup]
    placement_groups: dict[str, Any]
    critic: CriticGroup | None = None  # PPO's value model (critic_config)
    teacher: TeacherGroup | None = None  # on-policy distillation's teacher (teacher_config)

    @property
    def generator(self) -> RolloutGenerator:
        """The group that generates: the rollout group, else the hybrid actor."""
        return self.rollout if self.rollout is not None else self.actor

    def shutdown(self) -> None:
        if self.rollout is not None:
            self.rollout.close()
        shutdown_groups(self.groups, self.placement_groups)


def sync_weights(roles: Roles) -> dict[str, float]:
    """Trained weights to every rollout engine after an update: the hybrid actor streams them
    into its own engines; a separate rollout group receives object-store buckets."""
    if roles.rollout is None:
        return roles.actor.sync_weights()
    start = time.perf_counter()
    moved = roles.rollout.load_weights(roles.actor.pack_weights())
    return {
        "timing/resharding_to_infer": time.perf_counter() - start,
        "resharding/bytes": float(moved),
    }


def shutdown_groups(groups: list[WorkerGroup], placement_groups: dict[str, Any]) -> None:
    from mindrl.cluster.placement_groups import remove_placement_groups

    for group in groups:
        group.shutdown()
    remove_placement_groups(placement_groups)


def threads_per_worker(
    run: RunConfig, bundle_cpus: float, plan: PlacementPlan, node_cpus: float | None
) -> int:
    """`runtime.worker_threads`, else the bundle's CPUs (Ray would set OMP_NUM_THREADS to the
    actor's fractional share). On a CPU run on one node (`node_cpus`) whose CPUs the bundles
    leave idle, the node's CPUs are spread over the plan's worker processes instead: a run
    of fewer workers than cores (the tiny run with the reference in the actor is one process
    on a 1-CPU bundle) would otherwise leave cores idle while its one worker computes. Never
    more threads in all than the node has CPUs, so processes whose passes overlap do not
    fight over cores."""
    if run.runtime.worker_threads:
        return run.runtime.worker_threads
    threads = max(int(bundle_cpus), 1)
    if plan.resource == "CPU" and node_cpus is not None:
        threads = max(threads, int(node_cpus) // max(plan.worker_processes(), 1))
    return threads


def role_worker(role: str, run: RunConfig) -> tuple[type, tuple[Any, ...]]:
    """The worker class of a role and its constructor's arguments; an unknown role is an
    error naming the known ones (a plan from a newer config must not start a class-less group)."""
    from mindrl.workers.actor import ActorWorker
    from mindrl.workers.critic import CriticWorker
    from mindrl.workers.megatron_worker import ReferenceWorker, TeacherWorker
    from mindrl.workers.reward import RewardWorker
    from mindrl.workers.rollout import RolloutWorker

    workers: dict[str, tuple[type, tuple[Any, ...]]] = {
        "actor": (ActorWorker, (run, run.hybrid_rollout)),
        "ref": (ReferenceWorker, (run,)),
        "rollout": (RolloutWorker, (run,)),
        "reward": (RewardWorker, (run,)),
        "critic": (CriticWorker, (run,)),
        "teacher": (TeacherWorker, (run,)),
    }
    if role not in workers:
        raise ValueError(f"no worker for role {role!r}; the known roles: {', '.join(workers)}")
    return workers[role]


def _rollout_role(
    run: RunConfig, group: WorkerGroup | None, tokenizer: TokenizerSource
) -> RolloutGroup | ServerRolloutGroup | None:
    """A rollout role of its own: the run's rollout workers, or the user's vLLM servers."""
    if run.generate.server is not None:
        needed = run.rl.algorithm.max_prompt_length + run.generate.sampling_config.max_tokens
        return ServerRolloutGroup(run.generate.server, needed, tokenizer.get())
    return RolloutGroup(group) if group is not None else None


def start_roles(
    run: RunConfig,
    plan: PlacementPlan,
    master_addr: str | None,
    node_cpus: float | None,
    tokenizer: TokenizerSource,
) -> Roles:
    """Placement groups, then one worker group per role; constructors only (no model yet).
    `node_cpus`: the CPUs of the cluster's one node (None on several nodes); `tokenizer`: the
    actor's, for a rollout role of the user's vLLM servers."""
    from mindrl.cluster.placement_groups import (
        bundle_indices,
        cpus_per_worker,
        create_placement_groups,
        describe_bundle_nodes,
        devices_per_worker,
    )
    from mindrl.cluster.worker_group import WorkerGroup

    timeout = run.runtime.worker_timeout_s
    pgs = create_placement_groups(plan, timeout_s=min(timeout, 300.0))
    logger.info("%s", describe_bundle_nodes(pgs))
    groups: dict[str, WorkerGroup] = {}
    try:
        for device_group in plan.groups:
            for layout in device_group.roles:
                cls, args = role_worker(layout.role, run)
                cpus = cpus_per_worker(device_group)
                threads = threads_per_worker(
                    run, float(device_group.bundle.get("CPU", 1.0)), plan, node_cpus
                )
                logger.info("%s: %d torch thread(s) per worker", layout.role, threads)
                groups[layout.role] = WorkerGroup(
                    cls,
                    layout.role,
                    pgs[device_group.name],
                    bundle_indices(device_group, layout.role),
                    num_cpus_per_worker=cpus,
                    num_devices_per_worker=devices_per_worker(device_group, plan.resource),
                    device_resource=plan.resource,
                    env=worker_env(run, threads),
                    init_args=args,
                    master_addr=master_addr,
                    timeout_s=timeout,
                )
    except BaseException:
        shutdown_groups(list(groups.values()), pgs)
        raise
    ref, reward, rollout, critic, teacher = (
        groups.get(r) for r in ("ref", "reward", "rollout", "critic", "teacher")
    )
    actor = ActorGroup(groups["actor"])
    reference: ReferenceGroup | ReferenceInActor | None = None
    if ref is not None:
        reference = ReferenceGroup(ref)
    elif run.reference_in_actor:
        reference = ReferenceInActor(actor)
    return Roles(
        actor=actor,
        ref=reference,
        reward=RewardModelGroup(reward) if reward is not None else None,
        rollout=_rollout_role(run, rollout, tokenizer),
        groups=list(groups.values()),
        placement_groups=pgs,
        critic=CriticGroup(critic) if critic is not None else None,
        teacher=TeacherGroup(teacher) if teacher is not None else None,
    )
