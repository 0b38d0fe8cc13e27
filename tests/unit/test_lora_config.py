"""LoRA's config rules and plan (MindSpeed-RL's GRPO-LoRA keys): the shared-backbone
reference runs no processes of its own, the rules MindSpeed-RL enforces are enforced, the
memory plan trains only the adapters, and MindSpeed's `num_layer_list` is accepted when it
matches PP and num_layers."""

from __future__ import annotations

import logging

import pytest

from mindrl.cluster.placement import plan_placement
from mindrl.config import load_run_config
from mindrl.config.errors import ConfigError
from mindrl.config.fates import reset_warnings
from mindrl.config.meaning import meaning_lines
from mindrl.planning.params import layer_params, lora_layer_params

LORA = "grpo_lora_tiny_cpu"
TARGETS = "megatron_training.lora_target_modules=[linear_qkv,linear_proj,linear_fc1,linear_fc2]"


def _load(name: str, *overrides: str):
    return load_run_config(name, list(overrides), check_paths=False)[0]


def test_the_shared_backbone_reference_runs_in_the_actors_processes():
    run = _load(LORA)
    assert run.actor.lora.targets == ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
    assert run.actor.lora.scale == 2.0
    assert run.ref is not None and run.shares_backbone  # KL still has its reference ...
    assert [r.role for r in run.roles] == ["actor"]  # ... which starts no processes
    (group,) = plan_placement(run, "CPU").groups
    assert [layout.role for layout in group.roles] == ["actor"]
    assert any("adapters off (share_backbone" in line for line in meaning_lines(run))


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["megatron_training.stage=ray_dapo"], "cannot be true with stage ray_dapo"),
        (["~megatron_training.lora_target_modules"], "can only be used with LoRA"),
        (
            ["rl_config.use_integrated_worker=false", "rl_config.colocate_actor_ref=true"],
            "needs use_integrated_worker: true",
        ),
    ],
    ids=["dapo", "no_lora", "separate_reference"],
)
def test_share_backbone_rules_as_mindspeed_rl(overrides, reason):
    with pytest.raises(ConfigError) as info:
        _load(LORA, *overrides)
    assert reason in str(info.value)


def test_lora_on_moe_experts_is_refused_by_name():
    with pytest.raises(ConfigError, match="LoRA on mixture-of-experts models is not built"):
        _load("grpo_tiny_moe_cpu", f"++{TARGETS}")


def test_lora_fusion_is_accepted_with_a_no_effect_warning(caplog):
    reset_warnings()
    caplog.set_level(logging.WARNING, logger="mindrl.config")
    _load(LORA, "++megatron_training.lora_fusion=true")
    assert any("lora_fusion: true has no effect" in r.getMessage() for r in caplog.records)
    reset_warnings()


def test_the_plan_counts_the_adapters_the_model_builds():
    """53,248 = the adapter elements the tiny run's workers report (tests/e2e)."""
    run = _load(LORA)
    arch, lora = run.actor.model, run.actor.lora
    assert arch.num_layers * lora_layer_params(arch, lora) == 53248
    # split over TP 2: the column layers' A and the row layers' B are whole on each rank
    per_rank = lora_layer_params(arch, lora, tp=2)
    assert lora_layer_params(arch, lora) / 2 < per_rank < lora_layer_params(arch, lora)
    assert per_rank < layer_params(arch, tp=2)


def test_the_memory_plan_trains_the_adapters_only():
    from mindrl.planning.phases import stage_elements
    from mindrl.planning.shapes import role_shape

    run, full = _load(LORA), _load("grpo_tiny_cpu")
    held, trained = stage_elements(run, role_shape(run.actor, "cpu"), 0)
    full_held, full_trained = stage_elements(full, role_shape(full.actor, "cpu"), 0)
    assert trained == 53248 and held == full_held + trained
    assert full_trained == full_held


@pytest.mark.parametrize(
    ("value", "ok"), [("'2'", True), ("'1,1'", False), ("'1'", False), ("'a,b'", False)]
)
def test_num_layer_list_must_match_pp_and_num_layers(value, ok):
    override = f"++megatron_training.num_layer_list={value}"
    if ok:
        assert _load("grpo_tiny_cpu", override).actor.parallel.num_layer_list is not None
        return
    with pytest.raises(ConfigError, match="num_layer_list: "):
        _load("grpo_tiny_cpu", override)
