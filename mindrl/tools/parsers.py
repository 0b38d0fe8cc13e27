"""Tool-call parsers, chosen by ``rl_config.tool_parser_format`` (MindSpeed-RL: ``hermes``).

A parser reads the text of one model turn and returns the calls it asks for plus an error text
for each call it could not read, so a malformed call is answered and counted, never fatal.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from mindrl.tools.base import ToolCall


@dataclass(frozen=True)
class ParsedTurn:
    """A model turn split into the calls it makes and the calls that could not be read."""

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = field(default_factory=tuple)

    @property
    def asked_for_tools(self) -> bool:
        return bool(self.calls or self.errors)


class ToolCallParser(ABC):
    name: str = ""

    @abstractmethod
    def parse(self, text: str) -> ParsedTurn: ...


class HermesParser(ToolCallParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as Qwen2.5 / Qwen3 emit them."""

    name = "hermes"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[str] = []
        for body in self._CALL.findall(text):
            try:
                payload = json.loads(body)
            except json.JSONDecodeError as exc:
                errors.append(
                    f"Error: the tool call is not valid JSON ({exc.msg} at char {exc.pos})."
                )
                continue
            if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
                errors.append('Error: a tool call needs {"name": <string>, "arguments": {...}}.')
                continue
            arguments = payload.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    errors.append(
                        f"Error: the arguments of {payload['name']} are not a JSON object."
                    )
                    continue
            if not isinstance(arguments, dict):
                errors.append(f"Error: the arguments of {payload['name']} are not a JSON object.")
                continue
            calls.append(ToolCall(name=payload["name"], arguments=arguments))
        return ParsedTurn(calls=tuple(calls), errors=tuple(errors))


_PARSERS: dict[str, Callable[[], ToolCallParser]] = {HermesParser.name: HermesParser}


def parser_names() -> list[str]:
    return sorted(_PARSERS)


def get_parser(name: str) -> ToolCallParser:
    factory = _PARSERS.get(name)
    if factory is None:
        raise ValueError(
            f"tool_parser_format {name!r} is not known; known: {', '.join(parser_names())}"
        )
    return factory()


def register_parser(name: str, factory: Callable[[], ToolCallParser]) -> None:
    """Add a parser under a name ``tool_parser_format`` can select."""
    _PARSERS[name] = factory
