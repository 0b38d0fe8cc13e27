"""rl_config's multi-turn keys: MindSpeed-RL's names and meaning, what does not combine refused
by name, the tool YAML read (not imported) for the dry run's reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindrl.config import ConfigError, load_run_config
from mindrl.config.meaning import rollout_line
from mindrl.rollout.agent_rollout import loop_settings

TOOL_YAML = """
tools:
  - class_name: some_module_never_imported.Calculator
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: calculator
        description: Evaluates arithmetic.
        parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}
"""


def overrides(tool_yaml: Path, *extra: str) -> list[str]:
    return [
        "++rl_config.multi_turn_enable=true",
        f"++rl_config.tool_config_path={tool_yaml}",
        "++rl_config.max_tool_calls=2",
        "++rl_config.max_parallel_calls=1",
        "++rl_config.max_total_response_length=512",
        "++rl_config.max_tool_response_length=64",
        "++rl_config.tool_response_truncate_side=left",
        "++rl_config.tool_parser_format=hermes",
        "++rl_config.async_engine=true",
        *extra,
    ]


@pytest.fixture
def tool_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(TOOL_YAML)
    return path


def test_the_keys_reach_the_loop_and_the_dry_run_names_the_tools(tool_yaml: Path) -> None:
    run, _ = load_run_config("grpo_tiny_cpu", overrides(tool_yaml), check_paths=False)
    settings = loop_settings(run.rl.rollout_mode)
    assert (settings.max_tool_calls, settings.max_parallel_calls) == (2, 1)
    assert settings.max_total_response_length == 512
    assert (settings.max_tool_response_length, settings.tool_response_truncate_side) == (
        64,
        "left",
    )
    line = rollout_line(run)
    assert "multi-turn, hermes tool calls, at most 2 per response" in line
    assert "calculator (some_module_never_imported.Calculator)" in line


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["++rl_config.partial_rollout_max_split=2"], "with partial rollout"),
        (["++generate_config.rollout_backend=hf"], "the agent loop runs on vLLM"),
        (["++rl_config.max_tool_calls=0"], "max_tool_calls must be >= 1"),
        (["++rl_config.max_total_response_length=8"], "must be >= sampling_config.max_tokens"),
        (["++rl_config.tool_parser_format=nope"], "tool_parser_format 'nope' is not known"),
        (["++rl_config.tool_response_truncate_side=top"], "tool_response_truncate_side"),
    ],
)
def test_what_does_not_combine_is_refused_by_name(
    tool_yaml: Path, extra: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_run_config("grpo_tiny_cpu", overrides(tool_yaml, *extra), check_paths=False)


def test_a_broken_tool_yaml_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "tools.yaml"
    bad.write_text("tools: []\n")
    with pytest.raises(ConfigError, match="tool_config_path: .*at least one tool"):
        load_run_config("grpo_tiny_cpu", overrides(bad), check_paths=True)
