"""The system turn that shows a Qwen model its tools (hermes format), from the tools' schemas.

The text Qwen2.5's chat template writes for ``tools=``, and the one MindSpeed-RL's
``qwen_retool`` / ``qwen_search_tool`` prompt types carry as their default system prompt for
its code and search tools: one JSON line per schema between ``<tools>`` tags, then how to call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from mindrl.tools.base import ToolSchema

DEFAULT_SYSTEM = "You are a helpful assistant."
_HEAD = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tools_system_prompt(schemas: Sequence[ToolSchema], system: str = DEFAULT_SYSTEM) -> str:
    """``system`` followed by the hermes tools block for ``schemas``."""
    lines = "\n".join(json.dumps(schema.as_openai(), ensure_ascii=False) for schema in schemas)
    return system + _HEAD + lines + _TAIL
