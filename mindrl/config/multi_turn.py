"""Multi-turn tool rollout's rules (`rl_config.multi_turn_enable` and its keys, MindSpeed-RL's
names and meaning), and where the tool YAML is read from.

What does not combine, each refused by name: the HF engine (the agent loop steps vLLM's engine
itself), a user's vLLM server, an inference-TP group in the actor (its ranks would have to step
in lockstep while tools finish in any order), partial rollout (a response's tool state would
have to outlive the step; not built). The rollout pipeline works at any staleness
(`rollout_staleness: k`): its rollout workers run the same loop inside each batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mindrl.config.paths import CONFIG_DIR

if TYPE_CHECKING:
    from mindrl.config.run import RunConfig

DEFAULT_TOOL_PARSER = "hermes"


def tool_config_file(path: str) -> Path:
    """The tool YAML: absolute as given; relative from the working directory, as MindSpeed-RL
    reads it (its configs say ``./configs/tools/...`` and run from its checkout), else from
    mindrl's checkout, where the same relative path finds the shipped tool YAML."""
    given = Path(path).expanduser()
    if given.is_absolute():
        return given
    for base in (Path.cwd(), CONFIG_DIR.parent):
        if (base / given).is_file():
            return (base / given).resolve()
    return given.resolve()


def tool_parser_name(format_key: str | None) -> str:
    return format_key or DEFAULT_TOOL_PARSER


def multi_turn_problems(run: RunConfig, *, check_paths: bool = True) -> list[str]:
    mode = run.rl.rollout_mode
    if not mode.multi_turn_enable:
        return []
    from mindrl.tools.parsers import parser_names
    from mindrl.tools.registry import ToolConfigError, read_tool_config

    key = "rl_config.multi_turn_enable"
    out = []
    if run.generate.rollout_backend == "hf":
        out.append(f"{key} with generate_config.rollout_backend: hf: the agent loop runs on vLLM")
    if run.rollout_on_servers:
        out.append(f"{key} with generate_config.server (a user's vLLM server) is not built")
    if run.hybrid_rollout and run.generate.infer_tensor_parallel_size > 1:
        out.append(
            f"{key} with infer_tensor_parallel_size > 1 in the actor is not built: the TP ranks "
            "of one engine would have to step in lockstep while tools finish in any order"
        )
    if mode.partial_rollout_max_split > 1:
        out.append(f"{key} with partial rollout (partial_rollout_max_split > 1) is not built")
    if mode.max_tool_calls < 1:
        out.append(f"{key}: rl_config.max_tool_calls must be >= 1 (tool calls per response)")
    if mode.max_parallel_calls < 1:
        out.append(f"{key}: rl_config.max_parallel_calls must be >= 1 (calls run per turn)")
    max_tokens = run.generate.sampling_config.max_tokens
    if mode.max_total_response_length < max_tokens:
        out.append(
            f"{key}: rl_config.max_total_response_length ({mode.max_total_response_length}) "
            f"must be >= sampling_config.max_tokens ({max_tokens}), as in MindSpeed-RL"
        )
    parser = tool_parser_name(mode.tool_parser_format)
    if parser not in parser_names():
        out.append(
            f"rl_config.tool_parser_format {parser!r} is not known; known: "
            f"{', '.join(parser_names())}"
        )
    if not mode.tool_config_path:
        out.append(f"{key} needs rl_config.tool_config_path (the tool YAML)")
    elif check_paths:
        try:
            read_tool_config(tool_config_file(mode.tool_config_path))
        except ToolConfigError as exc:
            out.append(f"rl_config.tool_config_path: {exc}")
    return out
