"""The tool YAML (MindSpeed-RL's and verl's ``tools: [{class_name, config, tool_schema}]``) read into tools.

``class_name`` is looked up first among the names mindrl maps to its own tools (MindSpeed-RL's and
verl's class paths, so their YAML runs unchanged), then read as a user's tool: ``path/to/file.py:Class``
or an importable ``package.module.Class``. Loading a user's tool runs that user's module, as a
verifier file does; nothing else in the YAML executes.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mindrl.tools.base import Tool, ToolSchema


class ToolConfigError(ValueError):
    """A tool YAML that cannot be read into tools; the message names the entry and the fix."""


_TOOLS: dict[str, type[Tool]] = {}
# MindSpeed-RL's and verl's class paths of the tools mindrl has its own of
_BUILTIN_NAMES = frozenset(
    {
        "mindspeed_rl.tools.retool.ReTool",
        "mindspeed_rl.tools.sandbox_fusion_tool.SandboxFusionTool",
        "mindspeed_rl.tools.search_tool.SearchTool",
        "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
        "verl.tools.search_tool.SearchTool",
        "mindrl.tools.calculator.Calculator",
    }
)


def register_tool(cls: type[Tool], *class_names: str) -> type[Tool]:
    """Make ``cls`` the tool a YAML's ``class_name`` selects under each of ``class_names``."""
    for class_name in class_names:
        _TOOLS[class_name] = cls
    return cls


def _load_builtin_tools() -> None:
    """Import the modules that register mindrl's own tools (kept lazy: they pull HTTP clients)."""
    if _TOOLS.keys() >= _BUILTIN_NAMES:
        return
    from mindrl.tools.calculator import Calculator
    from mindrl.tools.code_interpreter import CodeInterpreterTool, ReToolInterpreter
    from mindrl.tools.search import SearchTool

    register_tool(
        CodeInterpreterTool,
        "mindspeed_rl.tools.sandbox_fusion_tool.SandboxFusionTool",
        "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
        "mindrl.tools.code_interpreter.CodeInterpreterTool",
    )
    register_tool(
        ReToolInterpreter,
        "mindspeed_rl.tools.retool.ReTool",
        "mindrl.tools.code_interpreter.ReToolInterpreter",
    )
    register_tool(
        SearchTool,
        "mindspeed_rl.tools.search_tool.SearchTool",
        "verl.tools.search_tool.SearchTool",
        "mindrl.tools.search.SearchTool",
    )
    register_tool(Calculator, "mindrl.tools.calculator.Calculator")


def registered_class_names() -> list[str]:
    _load_builtin_tools()
    return sorted(_TOOLS)


def _user_tool_class(class_name: str, base_dir: Path) -> type[Tool]:
    if ":" in class_name:
        file_part, _, attr = class_name.rpartition(":")
        path = Path(file_part)
        if not path.is_absolute():
            path = (base_dir / path).resolve()
        if not path.is_file():
            raise ToolConfigError(f"tool class_name {class_name!r}: no file {path}")
        module_name = f"mindrl_user_tool_{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ToolConfigError(f"tool class_name {class_name!r}: {path} is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    else:
        module_path, _, attr = class_name.rpartition(".")
        if not module_path:
            raise ToolConfigError(
                f"tool class_name {class_name!r} is neither a known tool ({', '.join(registered_class_names())}) "
                "nor 'package.module.Class' / 'path/to/file.py:Class'"
            )
        try:
            module = importlib.import_module(module_path)
        except ImportError as exc:
            raise ToolConfigError(
                f"tool class_name {class_name!r}: cannot import {module_path} ({exc}); known tools: "
                f"{', '.join(registered_class_names())}"
            ) from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise ToolConfigError(
            f"tool class_name {class_name!r} is not a subclass of mindrl.tools.base.Tool"
        )
    return cls


def tool_class(class_name: str, base_dir: Path) -> type[Tool]:
    _load_builtin_tools()
    return _TOOLS.get(class_name) or _user_tool_class(class_name, base_dir)


@dataclass(frozen=True)
class ToolEntry:
    """One entry of the tool YAML, read but not yet instantiated (the dry run stops here)."""

    class_name: str
    config: Mapping[str, Any]
    schema: ToolSchema


def read_tool_config(path: str | Path) -> list[ToolEntry]:
    """Parse and check the tool YAML without importing any tool."""
    path = Path(path)
    if not path.is_file():
        raise ToolConfigError(f"tool_config_path {path} does not exist")
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:  # a syntax error: its line, not a parser traceback
        raise ToolConfigError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    entries = document.get("tools") if isinstance(document, Mapping) else None
    if not isinstance(entries, Sequence) or not entries:
        raise ToolConfigError(f"{path}: expected a top-level 'tools:' list with at least one tool")
    result: list[ToolEntry] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or not entry.get("class_name"):
            raise ToolConfigError(f"{path}: tools[{index}] needs a class_name")
        schema_doc = entry.get("tool_schema")
        if not isinstance(schema_doc, Mapping):
            raise ToolConfigError(
                f"{path}: tools[{index}] ({entry['class_name']}) needs a tool_schema"
            )
        try:
            schema = ToolSchema.from_openai(schema_doc)
        except ValueError as exc:
            raise ToolConfigError(f"{path}: tools[{index}]: {exc}") from exc
        config = entry.get("config") or {}
        if not isinstance(config, Mapping):
            raise ToolConfigError(f"{path}: tools[{index}].config must be a mapping")
        result.append(
            ToolEntry(class_name=str(entry["class_name"]), config=dict(config), schema=schema)
        )
    names = [entry.schema.name for entry in result]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ToolConfigError(
            f"{path}: tool names must be unique, repeated: {', '.join(duplicates)}"
        )
    return result


def load_tools(path: str | Path) -> dict[str, Tool]:
    """Instantiate every tool of the YAML, keyed by the function name the model calls."""
    path = Path(path)
    return {
        entry.schema.name: tool_class(entry.class_name, path.parent)(entry.config, entry.schema)
        for entry in read_tool_config(path)
    }
