"""MindSpeed's layer layout keys at config time: `num_layer_list` (layers per pipeline stage)
and `noop_layers` (identity layers counted in num_layers) are read once, contradicting values
are one error naming the numbers before anything starts, the HF names skip the noop layers,
the memory plan sizes the largest stage and the placement line shows the layout."""

from __future__ import annotations

import pytest

from mindrl.config import ConfigError, load_run_config
from mindrl.config.layer_layout import layer_layout, layout_problems

PP2 = ["actor_config.pipeline_model_parallel_size=2", "rl_config.actor_resource.num_npus=2"]
FOUR = "model.tiny.num_layers=4"


def _load(*overrides: str):
    return load_run_config("grpo_tiny_cpu", list(overrides), check_paths=False)[0]


def test_the_layout_reads_mindspeeds_keys():
    layout = layer_layout(96, 4, "24,24,24,24", "5,95")
    assert layout.stage_layers == (24, 24, 24, 24) and not layout.uneven
    assert layout.weighted_layers_per_stage() == (23, 24, 24, 23)
    uneven = layer_layout(64, 4, "16,17,16,15")
    assert [list(r)[:1] for r in uneven.stage_ranges()] == [[0], [16], [33], [49]]
    assert uneven.megatron_layout() == [
        ["embedding", *["decoder"] * 16],
        ["decoder"] * 17,
        ["decoder"] * 16,
        [*["decoder"] * 15, "loss"],
    ]
    assert uneven.describe() == "layers per stage 16,17,16,15"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((64, 4, "16,17,16,16", None), "16,17,16,16 adds up to 65 layers but num_layers is 64"),
        ((64, 2, "16,17,16,15", None), "has 4 stages but pipeline_model_parallel_size is 2"),
        ((64, 4, "16,x", None), "num_layer_list: '16,x' is not a comma-separated list"),
        ((64, 4, None, "5,64"), "noop_layers: 64 outside the layers 0..63"),
        ((64, 4, None, "5,5"), "noop_layers: 5 listed twice"),
        ((2, 1, None, "0,1"), "all 2 layers are noop layers"),
    ],
)
def test_contradicting_values_name_the_numbers(args, message):
    problems = layout_problems(*args)
    assert any(message in p for p in problems), problems
    with pytest.raises(ValueError, match=message.split(" ")[0]):
        layer_layout(*args)


def test_uneven_stages_under_the_virtual_pipeline_are_refused_by_name():
    problems = layout_problems(8, 2, "5,3", None, virtual_pipeline=True)
    assert problems == [
        "num_layer_list with num_layers_per_virtual_pipeline_stage: uneven stages under the "
        "virtual pipeline are not built (num_layer_list gives layers per stage, not per model "
        "chunk)"
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([FOUR, *PP2, "++actor_config.num_layer_list='2,1'"], "actor_config.num_layer_list: 2,1 adds up to 3 layers but num_layers is 4"),
        ([FOUR, "++actor_config.num_layer_list='3,1'"], "actor_config.num_layer_list: 3,1 has 2 stages but pipeline_model_parallel_size is 1"),
        ([FOUR, "++actor_config.noop_layers='4'"], "actor_config.noop_layers: 4 outside the layers 0..3"),
        ([FOUR, *PP2, "++actor_config.num_layer_list='3,1'", "actor_config.num_layers_per_virtual_pipeline_stage=1"], "virtual pipeline are not built"),
    ],
)  # fmt: skip
def test_the_config_refuses_a_contradicting_layout(overrides, message):
    with pytest.raises(ConfigError, match="num_layer_list|noop_layers") as err:
        _load(*overrides)
    assert message in str(err.value)


def test_hf_names_skip_the_noop_layers():
    import dataclasses

    from mindrl.checkpoint.mapping import bound_rules

    arch = _load(FOUR).actor.model
    padded = dataclasses.replace(arch, num_layers=6, noop_layers="1,5")
    names = {b.mcore: b.hf for b in bound_rules(padded)}
    plain = {b.mcore: b.hf for b in bound_rules(arch)}
    assert sorted(v for vs in names.values() for v in vs) == sorted(
        v for vs in plain.values() for v in vs
    )
    layer_of = {m.split(".")[2]: h[0].split(".")[2] for m, h in names.items() if ".layers." in m}
    assert layer_of == {"0": "0", "2": "1", "3": "2", "4": "3"}
    assert padded.hf_num_layers == 4


def test_the_plan_and_the_placement_line_show_the_layout():
    from mindrl.cluster.placement import plan_placement
    from mindrl.planning.phases import stage_elements
    from mindrl.planning.shapes import role_shape

    run = _load(FOUR, *PP2, "++actor_config.num_layer_list='3,1'", "++actor_config.noop_layers='2'")
    shape = role_shape(run.actor, "cpu")
    assert shape.stage_layers == (2, 1) and shape.layers_per_stage == 2
    even = role_shape(_load(FOUR, *PP2).actor, "cpu")
    assert stage_elements(run, shape, 0)[0] == stage_elements(run, even, 0)[0]
    line = plan_placement(run, "CPU").describe()
    assert "actor    devices=2 TP=1 PP=2 DP=1 (layers per stage 3,1; noop layers 2)" in line
