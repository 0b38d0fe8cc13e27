"""Tools failing inside a multi-turn rollout: each failure costs the calls it touches (answered
to the model and counted), never the rollout.

The agent loop runs with a scripted policy (the turns are the test's; the loop, the tools and
the sandbox server are real). Covered here: a tool whose create() raises or hangs, a release()
that raises, a tool that floods its answer, and a sandbox server killed while a call runs on it
(the call in flight and the calls after it fail as ``server_down``; other samples go on).
The model's own mistakes (bad JSON, unknown tool, missing argument) and execute() raising or
hanging: tests/unit/test_agent_loop.py; the sandbox's limits: test_sandbox_limits.py; a service
that is down at start: tests/integration/test_tool_services.py and the dry-run test.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from mindrl.rollout.agent_loop import AgentLoop, AgentLoopSettings, GeneratedTurn
from mindrl.rollout.agent_turns import STOP_MODEL, ToolTurnRenderer
from mindrl.rollout.base import RolloutSampling
from mindrl.tools.base import Tool, ToolResult, ToolSchema
from mindrl.tools.http_service import port_answers
from mindrl.tools.parsers import get_parser
from mindrl.tools.registry import load_tools
from tests.local_ports import unused_port

Turn = str | Callable[[], Any]  # a text, or a coroutine function giving the text


class Scripted:
    """Each sample (by its prompt's first id) returns its scripted turns in order."""

    def __init__(self, tokenizer: Any, scripts: dict[int, list[Turn]]) -> None:
        self.tokenizer = tokenizer
        self.scripts = {k: list(v) for k, v in scripts.items()}

    async def generate_turn(
        self, context: list[int], sampling: RolloutSampling, max_tokens: int, seed: int
    ) -> GeneratedTurn:
        turn = self.scripts[context[0]].pop(0)
        text = turn if isinstance(turn, str) else await turn()
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        return GeneratedTurn(ids, [-0.5] * len(ids), False)

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def run(
    tokenizer: Any, tools: Mapping[str, Tool], scripts: dict[int, list[Turn]], **limits: Any
) -> tuple[list[Any], list[str]]:
    settings = AgentLoopSettings(
        **{"max_tool_calls": 2, "max_total_response_length": 4096, **limits}
    )
    loop = AgentLoop(
        Scripted(tokenizer, scripts),
        tools,
        get_parser("hermes"),
        ToolTurnRenderer(tokenizer),
        settings,
    )
    prompts = [[k, 5] for k in scripts]
    kwargs = [{"fragile": {"create_kwargs": {"mode": f"m{k}"}}} for k in scripts]
    sampling = RolloutSampling(n=1, max_tokens=256)
    trajs = asyncio.run(loop.run(prompts, sampling, [0] * len(prompts), kwargs))
    texts = [str(tokenizer.decode(t.response_ids, skip_special_tokens=False)) for t in trajs]
    return trajs, texts


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


class Fragile(Tool):
    """create() raises for mode m3, hangs for m4; release() raises for m7; execute floods."""

    def __init__(self) -> None:
        super().__init__({}, ToolSchema("fragile", "Fails.", {"type": "object"}))
        self.modes: dict[str, str] = {}

    async def create(self, instance_id: str, **create_kwargs: Any) -> None:
        mode = create_kwargs["mode"]
        if mode == "m3":
            raise RuntimeError("no state for you")
        if mode == "m4":
            await asyncio.sleep(3600)
        self.modes[instance_id] = mode

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult("x" * 1_000_000)  # a flood: the loop cuts it

    async def release(self, instance_id: str) -> None:
        if self.modes.pop(instance_id) == "m7":
            raise RuntimeError("release broke")


def test_a_tool_that_fails_to_set_up_hangs_or_floods_costs_only_its_samples(tokenizer: Any) -> None:
    started = time.monotonic()
    trajs, texts = run(
        tokenizer,
        {"fragile": Fragile()},
        {k: [call("fragile"), "done"] for k in (3, 4, 7, 8)},
        tool_timeout_s=1.0,
        max_tool_response_length=100,
    )
    assert time.monotonic() - started < 60  # the hanging create() was bounded
    assert [t.stop for t in trajs] == [STOP_MODEL] * 4 and all(t.turns == 2 for t in trajs)
    assert "fragile.create() failed: RuntimeError('no state for you')" in texts[0]
    assert "fragile.create() did not finish within 1 s" in texts[1]
    # per sample: a failed create() and the call it then refused, or a failed release()
    assert [t.tool_errors for t in trajs] == [2, 2, 1, 0]
    for text in texts[2:]:  # the flood, cut to the limit
        assert text.count("x") == 100 and "...(truncated)..." in text


RETOOL_YAML = """
tools:
  - class_name: mindspeed_rl.tools.retool.ReTool
    config: {{sandbox_fusion_url: "{url}", default_timeout: 30}}
    tool_schema:
      type: function
      function:
        name: code_interpreter
        description: Runs code.
        parameters: {{type: object, properties: {{code: {{type: string}}}}, required: [code]}}
"""


def test_a_sandbox_killed_mid_rollout_costs_only_the_calls_it_touches(
    tokenizer: Any, tmp_path: Path
) -> None:
    port = unused_port()
    url = f"http://127.0.0.1:{port}/run_code"
    server = subprocess.Popen(
        [sys.executable, "-m", "mindrl.tools.sandbox_server", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_answers(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        (tmp_path / "tools.yaml").write_text(RETOOL_YAML.format(url=url))
        tools = load_tools(tmp_path / "tools.yaml")
        assert tools["code_interpreter"].config["sandbox_fusion_url"] == url

        async def before_the_kill() -> str:  # sample 4 runs quick code while the server lives
            return call("code_interpreter", code="print(6 * 7)")

        async def after_the_kill() -> str:  # sample 7 asks once the server is gone
            await asyncio.sleep(2.0)  # sample 3's sleeping code is on the server by now
            server.kill()
            server.wait()
            return call("code_interpreter", code="print(1)")

        trajs, texts = run(
            tokenizer,
            tools,
            {
                3: [call("code_interpreter", code="import time\ntime.sleep(60)"), "done"],
                4: [before_the_kill, "done"],
                7: [after_the_kill, "done"],
                8: ["no tools needed"],
            },
        )
        asyncio.run(tools["code_interpreter"].close())
    finally:
        server.kill()
        server.wait()
    assert [t.stop for t in trajs] == [STOP_MODEL] * 4
    assert [t.turns for t in trajs] == [2, 2, 2, 1]
    assert "42" in texts[1] and trajs[1].tool_errors == 0  # answered before the kill
    assert [t.tool_errors for t in trajs] == [1, 0, 1, 0]  # the call in flight, the one after
    assert "cannot be reached" in texts[2] or "connection failed" in texts[2]
