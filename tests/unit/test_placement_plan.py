"""`plan_placement` on the shipped configs (with overrides): device groups, the roles in each
group with their TP / PP / DP (and EP / expert DP for MoE), bundle sizes, colocation, the placement strategy, and the
refusal of a plan the cluster cannot hold. The CLI's own job (exit code, printing the plan) is
tests/integration/test_cli_dry_run.py."""

from __future__ import annotations

import pytest

from mindrl.cluster.placement import ClusterResources, PlacementPlan, RoleLayout, plan_placement
from mindrl.config import ConfigError, load_run_config


def _plan(
    name: str,
    overrides: tuple[str, ...] | list[str] = (),
    resource: str = "CPU",
    per_node: float | None = 8,
) -> PlacementPlan:
    run, _ = load_run_config(name, list(overrides), check_paths=False)
    return plan_placement(run, resource, per_node)


def _layout(plan: PlacementPlan) -> list[tuple[str, int, str, dict, list[tuple]]]:
    """(group, devices, strategy, bundle, [(role, devices, tp, pp, dp)]) per group."""
    return [
        (
            g.name,
            g.num_devices,
            g.strategy,
            g.bundle,
            [(r.role, r.num_devices, r.tp, r.pp, r.dp) for r in g.roles],
        )
        for g in plan.groups
    ]


def _node(**resources: float) -> ClusterResources:
    return ClusterResources(nodes=(dict(resources),))


def test_tiny_cpu_default_colocates_actor_and_ref_on_one_device():
    plan = _plan("grpo_tiny_cpu", per_node=2)
    assert plan.resource == "CPU"
    assert _layout(plan) == [
        ("actor+ref", 1, "STRICT_PACK", {"CPU": 1.0}, [("actor", 1, 1, 1, 1), ("ref", 1, 1, 1, 1)])
    ]
    assert plan.total_devices == 1
    assert plan.demand() == {"CPU": 1.0}
    assert plan.fit_problems(_node(CPU=2.0)) == []


def test_separate_ref_group_at_actor_tp2():
    plan = _plan(
        "grpo_tiny_cpu",
        [
            "rl_config.actor_resource.num_npus=2",
            "actor_config.tensor_model_parallel_size=2",
            "rl_config.colocate_actor_ref=false",
            "+rl_config.reference_resource.num_npus=1",
        ],
        per_node=4,
    )
    assert _layout(plan) == [
        ("actor", 2, "STRICT_PACK", {"CPU": 1.0}, [("actor", 2, 2, 1, 1)]),
        ("ref", 1, "STRICT_PACK", {"CPU": 1.0}, [("ref", 1, 1, 1, 1)]),
    ]
    assert plan.demand() == {"CPU": 3.0}  # one bundle per device, groups do not share


def test_expert_parallel_shows_in_the_layout_line_only_when_on():
    plan = _plan("grpo_tiny_moe_cpu", per_node=2)
    [group] = plan.groups
    assert [(r.role, r.tp, r.pp, r.dp, r.ep, r.expert_dp) for r in group.roles] == [
        ("actor", 1, 1, 2, 2, 1),
        ("ref", 1, 1, 2, 2, 1),
    ]
    text = plan.describe()
    assert "    actor    devices=2 TP=1 PP=1 DP=2 EP=2 expert-DP=1\n" in text
    assert text.endswith("    ref      devices=2 TP=1 PP=1 DP=2 EP=2 expert-DP=1")
    # megatron's expert data parallel: devices / (TP x PP x EP), experts split over TP
    wide = RoleLayout("actor", 16, 2, 2, 4, ep=2)
    assert wide.describe() == "actor    devices=16 TP=2 PP=2 DP=4 EP=2 expert-DP=2"
    assert "EP=" not in _plan("grpo_tiny_cpu").describe()


def test_separate_rollout_group_gets_infer_tp_devices():
    plan = _plan("grpo_tiny_cpu", ["rl_config.rollout_resource.num_npus=1"], per_node=4)
    assert [g.name for g in plan.groups] == ["actor+ref", "rollout"]
    rollout = plan.groups[1]
    assert rollout.num_devices == 1  # generate_config.infer_tensor_parallel_size
    assert [(r.role, r.num_devices, r.tp, r.pp, r.dp) for r in rollout.roles] == [
        ("rollout", 1, 1, 1, 1)
    ]
    assert plan.demand() == {"CPU": 2.0}


def test_bundle_carries_the_cpus_per_placement_group_bundle():
    plan = _plan("grpo_tiny_cpu", ["rl_config.num_cpus_for_placement_group=2"], per_node=4)
    assert [g.bundle for g in plan.groups] == [{"CPU": 2.0}]
    assert plan.demand() == {"CPU": 2.0}


def test_qwen25_7b_on_npus_one_group_per_role():
    plan = _plan("grpo_qwen25_7b", resource="NPU", per_node=8)
    bundle = {"NPU": 1.0, "CPU": 8.0}  # a device plus num_cpus_for_placement_group CPUs
    assert _layout(plan) == [
        ("actor", 4, "STRICT_PACK", bundle, [("actor", 4, 4, 1, 1)]),
        ("ref", 2, "STRICT_PACK", bundle, [("ref", 2, 2, 1, 1)]),
        ("reward", 2, "STRICT_PACK", bundle, [("reward", 2, 1, 1, 2)]),
    ]
    assert plan.demand() == {"NPU": 8.0, "CPU": 64.0}
    assert plan.fit_problems(_node(NPU=8.0, CPU=64.0)) == []


def test_colocate_all_models_puts_every_role_in_the_largest_group():
    plan = _plan("grpo_qwen25_7b", ["rl_config.colocate_all_models=true"], "NPU", per_node=8)
    [group] = plan.groups
    assert group.name == "actor+ref+reward"
    assert group.num_devices == 4  # the largest role; the others share its devices
    assert [(r.role, r.num_devices, r.tp, r.pp, r.dp) for r in group.roles] == [
        ("actor", 4, 4, 1, 1),
        ("ref", 2, 2, 1, 1),
        ("reward", 2, 1, 1, 2),
    ]
    assert plan.demand() == {"NPU": 4.0, "CPU": 32.0}


def test_groups_larger_than_a_node_may_span_nodes():
    plan = _plan("r1_zero_qwen25_32b", resource="NPU", per_node=8)
    assert [(g.name, g.num_devices, g.strategy) for g in plan.groups] == [
        ("actor", 16, "PACK"),
        ("ref", 16, "PACK"),
    ]
    roles = [(r.role, r.tp, r.pp, r.dp) for g in plan.groups for r in g.roles]
    assert roles == [("actor", 8, 2, 1), ("ref", 8, 1, 2)]
    four_nodes = ClusterResources(nodes=tuple({"NPU": 8.0, "CPU": 64.0} for _ in range(4)))
    assert plan.fit_problems(four_nodes) == []
    # without a node size (nothing known about the cluster) no group is pinned to one node
    assert {g.strategy for g in _plan("grpo_tiny_cpu", per_node=None).groups} == {"PACK"}


@pytest.mark.parametrize(
    "name", ["grpo_tiny_cpu", "grpo_qwen25_7b", "r1_zero_qwen25_7b", "r1_zero_qwen25_32b"]
)
def test_every_role_layout_covers_its_devices(name):
    plan = _plan(name, resource="NPU", per_node=8)
    for g in plan.groups:
        assert g.num_devices == max(r.num_devices for r in g.roles), g.name
        assert g.bundle["NPU"] == 1.0
        for r in g.roles:
            assert r.tp * r.pp * r.dp == r.num_devices, (g.name, r)


def test_r1_zero_7b_dp_follows_from_devices_tp_and_pp():
    plan = _plan("r1_zero_qwen25_7b", resource="NPU", per_node=8)
    assert _layout(plan) == [
        ("actor", 8, "STRICT_PACK", {"NPU": 1.0, "CPU": 1.0}, [("actor", 8, 2, 4, 1)]),
        ("ref", 8, "STRICT_PACK", {"NPU": 1.0, "CPU": 1.0}, [("ref", 8, 2, 2, 2)]),
    ]


def test_a_plan_the_cluster_cannot_hold_is_refused():
    plan = _plan("grpo_tiny_cpu", ["rl_config.actor_resource.num_npus=2"], per_node=1)
    assert plan.demand() == {"CPU": 2.0}
    assert plan.fit_problems(_node(CPU=1.0)) == [
        "rl_config.*_resource: the run needs 2 CPU (actor+ref=2) but the cluster has 1 over "
        "1 node(s)"
    ]
    assert plan.fit_problems(_node(CPU=2.0)) == []
    # per resource: enough NPUs is not enough when the bundles' CPUs are missing
    npu = _plan("grpo_qwen25_7b", resource="NPU", per_node=8)
    problems = npu.fit_problems(_node(NPU=8.0, CPU=16.0))
    assert problems == [
        "rl_config.*_resource: the run needs 64 CPU (actor=4, ref=2, reward=2) but the cluster "
        "has 16 over 1 node(s)"
    ]


def test_a_layout_that_does_not_divide_the_devices_is_refused_before_planning():
    with pytest.raises(ConfigError, match=r"TP \(2\) x PP \(1\) = 2 does not divide"):
        _plan(
            "grpo_tiny_cpu",
            ["rl_config.actor_resource.num_npus=3", "actor_config.tensor_model_parallel_size=2"],
        )
