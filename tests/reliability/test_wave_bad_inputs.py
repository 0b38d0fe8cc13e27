"""Bad inputs to this wave's capabilities give one error naming the key, file or column, before
any worker starts: the tool YAML, DPO's pairwise rows, expert-parallel layouts and the
one-step-off pipeline's staleness. (Context-parallel and uneven pipeline layouts are refused
by name in tests/unit/test_context_parallel_plan.py and test_layer_layout_rules.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.config import ConfigError, load_run_config
from mindrl.data.config import PreprocessConfig
from mindrl.data.handlers import AlpacaStylePairwiseHandler, BadRow
from mindrl.tools.registry import ToolConfigError, load_tools, read_tool_config

SCHEMA = "tool_schema: {type: function, function: {name: calc, parameters: {type: object}}}"


def _multi_turn(tool_yaml: Path) -> list[str]:
    return [
        "++rl_config.multi_turn_enable=true",
        f"++rl_config.tool_config_path={tool_yaml}",
        "++rl_config.max_total_response_length=512",
        "++rl_config.async_engine=true",
    ]


# ------------------------------------------------------------------------ the tool YAML


def test_a_missing_tool_yaml_is_named_by_its_key(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(
        ConfigError, match=r"rl_config\.tool_config_path: .*nowhere\.yaml does not exist"
    ):
        load_run_config("grpo_tiny_cpu", _multi_turn(missing), check_paths=True)


def test_a_tool_yaml_that_is_not_yaml_is_named_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "tools.yaml"
    bad.write_text("tools:\n  - class_name: calc\n    config: {type: [native\n")
    with pytest.raises(
        ConfigError, match=r"rl_config\.tool_config_path: .*tools\.yaml is not valid YAML.*line"
    ):
        load_run_config("grpo_tiny_cpu", _multi_turn(bad), check_paths=True)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            f"class_name: Calculater\n    {SCHEMA}",
            r"'Calculater' is neither a known tool \(.*calculator",
        ),
        (
            f"class_name: missing_tool.py:Calc\n    {SCHEMA}",
            r"'missing_tool.py:Calc': no file .*missing_tool\.py",
        ),
        (
            f"class_name: not_a_tool.py:Calc\n    {SCHEMA}",
            r"'not_a_tool.py:Calc' is not a subclass of mindrl\.tools\.base\.Tool",
        ),
    ],
)
def test_an_unknown_tool_class_is_named(tmp_path: Path, entry: str, message: str) -> None:
    (tmp_path / "not_a_tool.py").write_text("Calc = 3\n")
    path = tmp_path / "tools.yaml"
    path.write_text(f"tools:\n  - {entry}\n")
    read_tool_config(path)  # the YAML itself is well formed: the class fails when loaded
    with pytest.raises(ToolConfigError, match=message):
        load_tools(path)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            "{type: function, function: {name: calc, parameters: object}}",
            r"'calc': tool_schema function\.parameters must be a JSON schema of type object",
        ),
        (
            "{type: function, function: {name: calc, parameters: {type: string}}}",
            r"'calc': tool_schema function\.parameters must be",
        ),
        ("{type: function, function: [calc]}", r"tools\[0\]: tool_schema needs function\.name"),
        ("calc", r"tools\[0\] \(x\.Calc\) needs a tool_schema"),
    ],
)
def test_a_bad_tool_schema_is_named(tmp_path: Path, schema: str, message: str) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(f"tools:\n  - class_name: x.Calc\n    tool_schema: {schema}\n")
    with pytest.raises(ToolConfigError, match=message):
        read_tool_config(path)


def test_repeated_tool_names_and_a_config_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(
        f"tools:\n  - class_name: x.A\n    {SCHEMA}\n  - class_name: x.B\n    {SCHEMA}\n"
    )
    with pytest.raises(ToolConfigError, match="tool names must be unique, repeated: calc"):
        read_tool_config(path)
    path.write_text(f"tools:\n  - class_name: x.A\n    config: [1, 2]\n    {SCHEMA}\n")
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.config must be a mapping"):
        read_tool_config(path)


# ------------------------------------------------------------------------ DPO's pairs


@pytest.fixture
def pair_handler() -> AlpacaStylePairwiseHandler:
    config = PreprocessConfig(
        output_prefix="unused",
        tokenizer_name_or_path="unused",
        handler_name="AlpacaStylePairwiseHandler",
        map_keys={"prompt": "question", "chosen": "good", "rejected": "bad"},
    )
    return AlpacaStylePairwiseHandler(config)


@pytest.mark.parametrize(
    ("row", "reason", "named"),
    [
        ({"question": "Q?", "good": "yes"}, "missing_key", "'bad' not in record"),
        ({"question": "Q?", "bad": "no"}, "missing_key", "'good' not in record"),
        ({"good": "yes", "bad": "no"}, "missing_key", "'question' not in record"),
        ({"question": "Q?", "good": ["yes"], "bad": "no"}, "wrong_type", "chosen 'good' is list"),
        ({"question": "Q?", "good": "yes", "bad": 3}, "wrong_type", "rejected 'bad' is int"),
        (
            {"question": "Q?", "good": "yes", "bad": "  "},
            "empty_response",
            "rejected 'bad' is empty",
        ),
    ],
)
def test_a_bad_pair_row_names_the_column(
    pair_handler: AlpacaStylePairwiseHandler, row: dict, reason: str, named: str
) -> None:
    with pytest.raises(BadRow) as err:
        pair_handler.convert(row)
    assert err.value.reason == reason and named in err.value.detail


# ------------------------------------------------------------------------ expert parallel


def test_expert_parallel_that_does_not_divide_the_experts_is_named() -> None:
    ep3 = ["actor_config.expert_model_parallel_size=3", "ref_config.expert_model_parallel_size=3"]
    with pytest.raises(ConfigError) as err:
        load_run_config("grpo_tiny_moe_cpu", ep3, check_paths=False)
    text = str(err.value)
    assert "actor_config.expert_model_parallel_size: 3 does not divide num_experts (8)" in text
    assert "ref_config.expert_model_parallel_size: 3 does not divide num_experts (8)" in text


def test_expert_parallel_that_does_not_tile_the_devices_is_named() -> None:
    with pytest.raises(
        ConfigError,
        match=r"actor_config\.expert_model_parallel_size: TP \(1\) x EP \(4\) x PP \(1\) = 4 "
        r"does not divide the role's 2 device\(s\) \(rl_config\.actor_resource\.num_npus\)",
    ):
        load_run_config("grpo_tiny_moe_cpu", ["actor_config.expert_model_parallel_size=4"])


def test_expert_parallel_on_a_dense_model_is_named() -> None:
    with pytest.raises(ConfigError, match="expert_model_parallel_size: 2"):
        load_run_config(
            "grpo_tiny_cpu",
            ["+actor_config.expert_model_parallel_size=2", "rl_config.actor_resource.num_npus=2"],
        )


# ------------------------------------------------------------------------ staleness

OWN_ROLLOUT = "rl_config.rollout_resource.num_npus=1"


@pytest.mark.parametrize(
    ("config", "overrides", "message"),
    [
        (
            "grpo_tiny_cpu",
            ["rl_config.rollout_staleness=-1"],
            "rl_config.rollout_staleness: -1 is out of range",
        ),
        (
            "grpo_tiny_cpu",
            ["rl_config.rollout_staleness=one"],
            "rl_config.rollout_staleness: expected an integer",
        ),
        (
            "dapo_tiny_cpu",
            ["rl_config.rollout_staleness=1", f"+{OWN_ROLLOUT}"],
            r"rl_config\.rollout_staleness: 1 with DAPO's dynamic sampling",
        ),
        (
            "grpo_tiny_cpu",
            [
                "rl_config.rollout_staleness=1",
                OWN_ROLLOUT,
                "+rl_config.partial_rollout_max_split=2",
            ],
            r"rl_config\.rollout_staleness: 1 with partial rollout",
        ),
    ],
)
def test_staleness_that_cannot_run_is_named(
    config: str, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_run_config(config, overrides, check_paths=False)
