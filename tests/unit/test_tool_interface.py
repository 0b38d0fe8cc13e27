"""The tool YAML reader and the hermes parser: MindSpeed-RL's YAML shape, malformed calls answered."""

from pathlib import Path

import pytest

from mindrl.tools.base import Tool, ToolResult
from mindrl.tools.parsers import get_parser
from mindrl.tools.registry import ToolConfigError, load_tools, read_tool_config

_USER_TOOL = """
from mindrl.tools.base import Tool, ToolResult

class Echo(Tool):
    async def execute(self, instance_id, arguments):
        return ToolResult(text=str(arguments["text"]) * self.config["times"])
"""


def test_hermes_reads_calls_and_names_the_bad_ones() -> None:
    turn = get_parser("hermes").parse(
        'Let me compute. <tool_call>{"name": "calc", "arguments": {"expr": "1+2"}}</tool_call>'
        '<tool_call>{"name": "calc", "arguments": "{\\"expr\\": \\"3\\"}"}</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1, 2]</tool_call>"
    )
    assert [(c.name, dict(c.arguments)) for c in turn.calls] == [
        ("calc", {"expr": "1+2"}),
        ("calc", {"expr": "3"}),
    ]
    assert len(turn.errors) == 2 and "not valid JSON" in turn.errors[0]
    assert not get_parser("hermes").parse("The answer is 3.").asked_for_tools
    with pytest.raises(ValueError, match="tool_parser_format 'nope'"):
        get_parser("nope")


def test_a_user_tool_from_a_file_is_loaded_by_its_yaml(tmp_path: Path) -> None:
    (tmp_path / "echo_tool.py").write_text(_USER_TOOL)
    (tmp_path / "tools.yaml").write_text(
        "tools:\n"
        "  - class_name: echo_tool.py:Echo\n"
        "    config: {times: 2}\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: echo\n"
        "        description: Repeats text.\n"
        "        parameters: {type: object, properties: {text: {type: string}}, required: [text]}\n"
    )
    tools = load_tools(tmp_path / "tools.yaml")
    echo = tools["echo"]
    assert isinstance(echo, Tool) and echo.schema.required == ("text",)
    import asyncio

    assert asyncio.run(echo.execute("0", {"text": "ab"})) == ToolResult(text="abab")
    assert echo.schema.as_openai()["function"]["name"] == "echo"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("tools: []\n", "at least one tool"),
        ("tools:\n  - config: {}\n", "needs a class_name"),
        ("tools:\n  - class_name: x.Y\n", "needs a tool_schema"),
        (
            "tools:\n  - class_name: x.Y\n    tool_schema: {type: function, function: {description: d}}\n",
            "function.name",
        ),
    ],
)
def test_bad_tool_yaml_is_named(tmp_path: Path, document: str, message: str) -> None:
    (tmp_path / "tools.yaml").write_text(document)
    with pytest.raises(ToolConfigError, match=message):
        read_tool_config(tmp_path / "tools.yaml")


def test_an_unknown_class_is_named_with_the_known_ones(tmp_path: Path) -> None:
    (tmp_path / "tools.yaml").write_text(
        "tools:\n  - class_name: nowhere.Tool\n    tool_schema: {type: function, function: {name: t}}\n"
    )
    with pytest.raises(ToolConfigError, match="cannot import nowhere"):
        load_tools(tmp_path / "tools.yaml")
