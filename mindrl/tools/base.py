"""The tool interface users implement: one instance per sample, created, called, scored, released.

The lifecycle follows MindSpeed-RL's and verl's ``BaseTool`` (create / execute / calc_reward /
release) so a tool written for either ports by renaming, but every step is a coroutine: the agent
loop runs the tools of all samples on one event loop, so a slow call never stalls another
sample's generation. A tool that only has blocking code wraps it in ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolSchema:
    """An OpenAI function schema: what the chat template shows the model in the system turn."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(self.parameters.get("required", ()))

    def as_openai(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` form chat templates take as ``tools=``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    @classmethod
    def from_openai(cls, schema: Mapping[str, Any]) -> ToolSchema:
        """Read the tool YAML's ``tool_schema`` (``type: function`` with a ``function`` mapping)."""
        function = schema.get("function", schema)
        if not isinstance(function, Mapping) or not function.get("name"):
            raise ValueError(
                f"tool_schema needs function.name, got {json.dumps(dict(schema))[:200]}"
            )
        parameters = function.get("parameters") or {}
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            raise ValueError(
                f"tool {function['name']!r}: tool_schema function.parameters must be a JSON "
                f"schema of type object (the call's arguments), got {json.dumps(parameters)[:200]}"
            )
        return cls(
            name=str(function["name"]),
            description=str(function.get("description", "")),
            parameters=dict(parameters),
        )


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for, as parsed from its turn."""

    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What a call returns to the model, and what the loop counts about it.

    ``error`` names the failure kind ("timeout", "error", "bad_call", "server_down", ...) when
    the call did not succeed; the text is still shown to the model so it can recover.
    """

    text: str
    reward: float = 0.0
    error: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)


class Tool(ABC):
    """A tool, configured once from the tool YAML (``config`` + ``tool_schema``)."""

    def __init__(self, config: Mapping[str, Any], schema: ToolSchema) -> None:
        self.config = dict(config)
        self.schema = schema

    @property
    def name(self) -> str:
        return self.schema.name

    async def create(self, instance_id: str, **create_kwargs: Any) -> None:
        """Set up per-sample state: ``create_kwargs`` are the dataset row's
        ``tools_kwargs[<this tool's name>]["create_kwargs"]`` (e.g. its ground truth; verl's
        format, `mindrl.data.tool_kwargs`), none when the row has none."""
        return None

    @abstractmethod
    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one call; return an error result rather than raising for the model's mistakes."""

    async def reward(self, instance_id: str) -> float:
        """A per-sample reward the tool contributes (MindSpeed-RL / verl ``calc_reward``)."""
        return 0.0

    async def release(self, instance_id: str) -> None:
        """Free per-sample state; called once per created instance, also after failures."""
        return None

    async def close(self) -> None:
        """Free what the tool holds for the whole run (clients, pools, embedded servers)."""
        return None
