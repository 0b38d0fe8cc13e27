"""Per-sample tool arguments: a dataset row's ``tools_kwargs``, carried to each tool's ``create``.

The format is verl's: ``{tool_name: {"create_kwargs": {...}}}``, at the row's top level or under
``extra_info`` (where verl's preprocessing scripts put it), e.g. a grading tool's ground truth
``{"calc_reward": {"create_kwargs": {"ground_truth": "42"}}}``. Preprocessing keeps it in the
prompt store's metadata (whatever ``dataset_additional_keys`` says), the rollout hands each
prompt's mapping to the agent loop, and the loop calls ``tool.create(instance_id,
**create_kwargs)`` for every sample of the prompt. MindSpeed-RL passes no per-sample arguments.
verl's other per-tool keys (``execute_kwargs``, ``calc_reward_kwargs``, ``release_kwargs``) are
not read by mindrl's loop, so a row that has one is refused by name rather than dropped quietly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TOOLS_KWARGS = "tools_kwargs"  # the key in a row and in the store's metadata
ROW_PATHS = (TOOLS_KWARGS, f"extra_info.{TOOLS_KWARGS}")  # where a row may hold it
CREATE_KWARGS = "create_kwargs"

ToolsKwargs = dict[str, dict[str, dict[str, Any]]]


def check_tools_kwargs(value: Any) -> ToolsKwargs:
    """``value`` as a tools_kwargs mapping; ValueError naming what is wrong."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{TOOLS_KWARGS} is {type(value).__name__}, not a mapping of tool names")
    out: ToolsKwargs = {}
    for tool, entry in value.items():
        if entry is None:  # parquet's struct columns give every row every tool, unset as null
            continue
        if not isinstance(entry, Mapping):
            raise ValueError(f"{TOOLS_KWARGS}.{tool} is {type(entry).__name__}, not a mapping")
        unknown = sorted(str(k) for k, v in entry.items() if k != CREATE_KWARGS and v)
        if unknown:
            raise ValueError(
                f"{TOOLS_KWARGS}.{tool}: {', '.join(unknown)} not read by mindrl's agent loop "
                f"(only {CREATE_KWARGS}, handed to the tool's create())"
            )
        create = entry.get(CREATE_KWARGS) or {}
        if not isinstance(create, Mapping):
            raise ValueError(
                f"{TOOLS_KWARGS}.{tool}.{CREATE_KWARGS} is {type(create).__name__}, not a mapping"
            )
        if not all(isinstance(k, str) for k in create):
            raise ValueError(f"{TOOLS_KWARGS}.{tool}.{CREATE_KWARGS} needs string keys")
        out[str(tool)] = {CREATE_KWARGS: dict(create)}
    return out


def record_tools_kwargs(metadata: Mapping[str, Any] | None) -> ToolsKwargs:
    """A prompt record's tools_kwargs (checked at preprocessing; empty when it has none)."""
    return check_tools_kwargs((metadata or {}).get(TOOLS_KWARGS))


def create_kwargs(tools_kwargs: Mapping[str, Any] | None, tool_name: str) -> dict[str, Any]:
    """What ``tool_name``'s create() gets for a sample."""
    entry = (tools_kwargs or {}).get(tool_name) or {}
    return dict(entry.get(CREATE_KWARGS) or {})
