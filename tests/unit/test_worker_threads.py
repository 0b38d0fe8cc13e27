"""Torch threads per worker (`roles.threads_per_worker`): the user's `runtime.worker_threads`,
else the bundle's CPUs, else on a one-node CPU run whose bundles leave CPUs idle the node's
CPUs over the plan's worker processes (never more threads in all than the node has CPUs)."""

from __future__ import annotations

import os

from mindrl.cluster.placement import PlacementPlan, plan_placement
from mindrl.config import load_run_config
from mindrl.trainer.roles import threads_per_worker

ONE_PROCESS = [  # the reference as a snapshot in the actor: no reference processes
    "rl_config.use_integrated_worker=true",
    "+rl_config.reference_in_actor=true",
    "~ref_config",
]


def _threads(overrides: list[str], node_cpus: float | None, resource: str = "CPU") -> list[int]:
    run, _ = load_run_config("grpo_tiny_cpu", overrides, check_paths=False)
    plan: PlacementPlan = plan_placement(run, resource, node_cpus or 8)
    return [
        threads_per_worker(run, g.bundle.get("CPU", 1.0), plan, node_cpus)
        for g in plan.groups
        for _ in g.roles
    ]


def test_one_process_on_a_one_cpu_bundle_takes_the_idle_core():
    assert _threads(ONE_PROCESS, node_cpus=2) == [2]
    assert _threads(ONE_PROCESS, node_cpus=8) == [8]


def test_processes_whose_passes_overlap_share_the_cores():
    # shipped: actor and reference, each its own process on one 1-CPU bundle
    assert _threads([], node_cpus=2) == [1, 1]
    assert _threads([], node_cpus=8) == [4, 4]
    assert _threads([], node_cpus=3) == [1, 1]


def test_bundle_cpus_on_several_nodes_and_the_users_choice_first():
    assert _threads(ONE_PROCESS, node_cpus=None) == [1]  # several nodes: the bundle's CPUs
    assert _threads([*ONE_PROCESS, "runtime.worker_threads=1"], node_cpus=8) == [1]
    assert _threads(["runtime.worker_threads=3"], node_cpus=2) == [3, 3]


def test_never_below_the_bundle():
    run, _ = load_run_config("grpo_tiny_cpu", [], check_paths=False)
    plan = plan_placement(run, "CPU", 2)
    assert threads_per_worker(run, 6.0, plan, node_cpus=2) == 6


def test_device_runs_keep_the_bundle_rule():
    assert _threads(ONE_PROCESS, node_cpus=None, resource="NPU") == [1]
    run, _ = load_run_config("grpo_tiny_cpu", ONE_PROCESS, check_paths=False)
    plan = plan_placement(run, "NPU", 8)
    assert threads_per_worker(run, 1.0, plan, node_cpus=64) == 1


def test_node_cpus_only_for_one_node_and_at_most_this_machines():
    from mindrl.cluster.placement import ClusterResources
    from mindrl.trainer.setup import one_node_cpus

    here = float(len(os.sched_getaffinity(0)))
    assert one_node_cpus(ClusterResources(nodes=({"CPU": 1.0},))) == min(1.0, here)
    assert one_node_cpus(ClusterResources(nodes=({"CPU": here + 8},))) == here  # ray_num_cpus
    assert one_node_cpus(ClusterResources(nodes=({"CPU": 2.0}, {"CPU": 2.0}))) is None
