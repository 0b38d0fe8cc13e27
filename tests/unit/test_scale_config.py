"""The scale keys at config time: megatron's own conditions on the virtual pipeline,
recompute and overlap, refused before any worker starts and naming the YAML key; and what
a valid set of keys becomes in megatron's TransformerConfig / DDP config."""

from __future__ import annotations

import pytest

from mindrl.config import load_run_config
from mindrl.config.errors import ConfigError


def _load(*overrides: str):
    run, _ = load_run_config("grpo_tiny_cpu", ["model.tiny.num_layers=4", *overrides])
    return run


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor_config.num_layers_per_virtual_pipeline_stage=1"],
            "actor_config.num_layers_per_virtual_pipeline_stage: the virtual pipeline needs",
        ),
        (
            [
                "rl_config.actor_resource.num_npus=2",
                "actor_config.pipeline_model_parallel_size=2",
                "actor_config.num_layers_per_virtual_pipeline_stage=3",
            ],
            "does not divide num_layers (4)",
        ),
        (
            [
                "rl_config.actor_resource.num_npus=2",
                "actor_config.pipeline_model_parallel_size=2",
                "actor_config.num_layers_per_virtual_pipeline_stage=2",
            ],
            "that is the plain pipeline",
        ),
        (
            ["megatron_training.recompute_granularity=full"],
            "recompute_granularity: full needs recompute_method",
        ),
        (
            [
                "megatron_training.recompute_granularity=selective",
                "megatron_training.recompute_method=block",
            ],
            "selective recompute takes neither",
        ),
        (["megatron_training.recompute_num_layers=2"], "only read with recompute_granularity"),
        (
            [
                "megatron_training.recompute_granularity=full",
                "megatron_training.recompute_method=block",
                "megatron_training.recompute_num_layers=5",
            ],
            "recompute_num_layers: 5 is more than the 4 layers",
        ),
        (
            ["megatron_training.overlap_param_gather=true"],
            "overlap_param_gather: needs use_distributed_optimizer",
        ),
        (["megatron_training.recompute_granularity=partial"], "recompute_granularity"),
        (
            ["megatron_training.exp_avg_dtype=bf16"],
            "exp_avg_dtype: only read with use_precision_aware_optimizer: true",
        ),
        (["megatron_training.exp_avg_sq_dtype=fp16"], "exp_avg_sq_dtype"),
    ],
)
def test_megatron_would_reject_it_so_the_config_does(overrides, message):
    with pytest.raises(ConfigError) as info:
        _load(*overrides)
    assert message in str(info.value)


def test_scale_keys_become_megatron_fields():
    from mindrl.models.scale import transformer_overrides, virtual_pipeline_size

    run = _load(
        "rl_config.actor_resource.num_npus=2",
        "actor_config.tensor_model_parallel_size=2",
        "megatron_training.sequence_parallel=true",
        "megatron_training.recompute_granularity=full",
        "megatron_training.recompute_method=block",
        "megatron_training.recompute_num_layers=2",
    )
    assert transformer_overrides(run.actor) == {
        "sequence_parallel": True,
        "recompute_granularity": "full",
        "recompute_method": "block",
        "recompute_num_layers": 2,
    }
    vpp = _load(
        "rl_config.actor_resource.num_npus=2",
        "actor_config.pipeline_model_parallel_size=2",
        "actor_config.num_layers_per_virtual_pipeline_stage=1",
        "rl_config.use_dynamic_bsz=false",  # token budgets under VPP: not built yet
    )
    assert virtual_pipeline_size(vpp.actor) == 2
    assert transformer_overrides(vpp.actor)["virtual_pipeline_model_parallel_size"] == 2


def test_sequence_parallel_at_tp1_has_no_effect_and_says_so(caplog):
    from mindrl.models.scale import transformer_overrides

    run = _load("megatron_training.sequence_parallel=true")
    with caplog.at_level("WARNING"):
        assert transformer_overrides(run.actor)["sequence_parallel"] is False
    assert "no effect at tensor_model_parallel_size 1" in caplog.text


def test_ddp_config_carries_the_distributed_optimizer_and_overlap():
    from mindrl.models.scale import ddp_config

    run = _load(
        "rl_config.actor_resource.num_npus=2",
        "megatron_training.use_distributed_optimizer=true",
        "megatron_training.overlap_grad_reduce=true",
        "megatron_training.overlap_param_gather=true",
        "megatron_training.ddp_bucket_size=1000000",
    )
    cfg = ddp_config(run.actor)
    assert cfg.use_distributed_optimizer and cfg.overlap_grad_reduce and cfg.overlap_param_gather
    assert cfg.bucket_size == 1000000 and cfg.grad_reduce_in_fp32


def test_mindspeed_memory_switches_are_refused_on_cpu_and_handed_on_npu():
    from mindrl.config.fates import MINDSPEED, handoffs

    run = _load("megatron_training.swap_optimizer=true", "megatron_training.use_fused_swiglu=true")
    with pytest.raises(ConfigError) as info:
        handoffs(run, "cpu")
    text = str(info.value)
    assert "actor_config.swap_optimizer: true is refused on cpu" in text
    # the fused SwiGLU is mindrl's own off NPU (models/host_fusions.py): not refused
    assert "use_fused_swiglu" not in text
    handed = handoffs(run, "npu").to(MINDSPEED)
    assert handed["swap_optimizer"] is True and handed["use_fused_swiglu"] is True


def test_a_bf16_second_moment_that_cannot_decay_is_warned(caplog):
    from mindrl.models.optimizer import warn_if_second_moment_stalls

    keys = ["use_precision_aware_optimizer=true", "exp_avg_sq_dtype=bf16"]
    narrowed = [f"megatron_training.{k}" for k in keys]
    with caplog.at_level("WARNING"):
        assert warn_if_second_moment_stalls(
            _load(*narrowed, "actor_config.adam_beta2=0.999").actor.optim
        )
    assert "stops decaying" in caplog.text
    assert not warn_if_second_moment_stalls(
        _load(*narrowed, "actor_config.adam_beta2=0.99").actor.optim
    )
    assert not warn_if_second_moment_stalls(_load("actor_config.adam_beta2=0.999").actor.optim)
