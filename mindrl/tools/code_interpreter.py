"""The code interpreter: runs the model's code on a SandboxFusion server (``POST /run_code``).

Registered under MindSpeed-RL's ``ReTool`` and ``SandboxFusionTool`` and verl's
``SandboxFusionTool``. ReTool also takes the code out of a fenced python block and prints the
value of its last line, as MindSpeed-RL's ReTool does. The request is SandboxFusion's
(``compile_timeout`` = ``run_timeout`` = the call's timeout, ``memory_limit_MB``, ``language``);
the client waits the two timeouts plus 10 s, as MindSpeed-RL's client does. The text returned is
the run's stdout + stderr; a non-zero exit, a timeout, an HTTP error or a server that is down
come back as a result with ``error`` set, never as an exception.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mindrl.tools.base import ToolResult, ToolSchema
from mindrl.tools.http_service import ServiceError, post_json
from mindrl.tools.service_tool import SHARED_KEYS, ServiceTool, bounded_text, warn_unknown_keys

CLIENT_SLACK_S = 10.0
KEYS = (
    "sandbox_fusion_url",
    "default_timeout",
    "default_language",
    "memory_limit_mb",
    *SHARED_KEYS,
)


class CodeInterpreterTool(ServiceTool):
    """SandboxFusion's code runner as a tool: ``{"code": ...}`` (optionally ``language``, ``timeout``)."""

    url_key = "sandbox_fusion_url"

    def __init__(self, config: Mapping[str, Any], schema: ToolSchema) -> None:
        super().__init__(config, schema, default_workers=10)
        warn_unknown_keys(schema.name, self.config, KEYS)
        self.default_timeout = float(self.config.get("default_timeout", 30))
        self.default_language = str(self.config.get("default_language", "python"))
        self.memory_limit_mb = int(self.config.get("memory_limit_mb", 1024))

    def prepare_code(self, code: str) -> str:
        return code

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult(
                text="Error: the code_interpreter needs a non-empty 'code' string.",
                error="bad_call",
            )
        # the model may shorten the timeout, never lengthen it past the configured one
        timeout = self.default_timeout
        if isinstance(arguments.get("timeout"), (int, float)) and arguments["timeout"] > 0:
            timeout = min(float(arguments["timeout"]), timeout)
        language = str(arguments.get("language") or self.default_language)
        payload = {
            "code": self.prepare_code(code),
            "language": language,
            "compile_timeout": timeout,
            "run_timeout": timeout,
            "memory_limit_MB": self.memory_limit_mb,
            "stdin": None,
            "files": {},
            "fetch_files": [],
        }
        try:
            answer = await self.call_blocking(
                lambda: post_json(self.url, payload, timeout=2 * timeout + CLIENT_SLACK_S)
            )
        except ServiceError as exc:
            return ToolResult(text=f"Error: the code sandbox failed: {exc}", error=exc.kind)
        return read_run_code_answer(answer, timeout)


def read_run_code_answer(answer: Mapping[str, Any], timeout: float) -> ToolResult:
    """SandboxFusion's ``RunCodeResponse`` -> the text the model sees and the error kind."""
    run = answer.get("run_result") or {}
    compiled = answer.get("compile_result") or {}
    output = bounded_text(str(run.get("stdout") or "") + str(run.get("stderr") or ""))
    if answer.get("status") == "SandboxError" or not run:
        message = answer.get("message") or compiled.get("stderr") or "no run result"
        return ToolResult(
            text=f"Error: the sandbox could not run the code: {message}", error="error"
        )
    metrics = {"execution_time": float(run.get("execution_time") or 0.0)}
    if run.get("status") == "TimeLimitExceeded":
        return ToolResult(
            text=output + f"\nError: the code ran past the time limit ({timeout:g} s).",
            error="timeout",
            metrics=metrics,
        )
    if run.get("status") != "Finished" or run.get("return_code") not in (0, None):
        return ToolResult(
            text=output or f"Error: exit code {run.get('return_code')}",
            error="error",
            metrics=metrics,
        )
    return ToolResult(text=output, metrics=metrics)


class ReToolInterpreter(CodeInterpreterTool):
    """MindSpeed-RL's ReTool: the first fenced python block, its last line printed."""

    _FENCE = re.compile(r"```python(.*?)```", re.DOTALL)

    def prepare_code(self, code: str) -> str:
        fenced = self._FENCE.findall(code)
        if fenced:
            code = fenced[0].strip()
        lines = code.split("\n")
        for index in range(len(lines) - 1, -1, -1):
            if lines[index] == "":
                continue
            if not lines[index].startswith("print"):
                lines[index] = f"print({lines[index]})"
            break
        return "\n".join(lines)
