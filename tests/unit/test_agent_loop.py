"""The agent loop's bookkeeping and limits, driven by a scripted policy (the loop is under test,
not the engine: tests/integration/test_agent_loop_vllm.py runs it on vLLM)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from mindrl.rollout.agent_loop import (
    AgentLoop,
    AgentLoopSettings,
    GeneratedTurn,
    trajectory_rows,
)
from mindrl.rollout.agent_turns import (
    STOP_CALLS,
    STOP_LENGTH,
    STOP_MODEL,
    STOP_TOTAL,
    ToolTurnRenderer,
    agent_step_metrics,
    truncate_tool_text,
)
from mindrl.rollout.base import RolloutSampling
from mindrl.tools.base import Tool, ToolResult, ToolSchema
from mindrl.tools.parsers import get_parser

ADD_SCHEMA = ToolSchema(
    "add",
    "Adds two integers.",
    {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"]},
)


class Add(Tool):
    """Adds; "slow" sleeps, "boom" raises: the loop must bound both."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__({}, ADD_SCHEMA)
        self.delay = delay
        self.live: set[str] = set()

    async def create(self, instance_id: str, **sample: Any) -> None:
        self.live.add(instance_id)

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        if arguments["a"] == "boom":
            raise RuntimeError("exploded")
        if arguments["a"] == "slow":
            await asyncio.sleep(60)
        await asyncio.sleep(self.delay)
        return ToolResult(str(int(arguments["a"]) + int(arguments["b"])))

    async def release(self, instance_id: str) -> None:
        self.live.remove(instance_id)


class ScriptedPolicy:
    """Returns the next scripted text of a sample (chosen by the prompt's first id) as ids."""

    def __init__(self, tokenizer: Any, scripts: dict[int, list[str]], eos: int) -> None:
        self.tokenizer = tokenizer
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.eos = eos
        self.contexts: list[list[int]] = []
        self.max_tokens: list[int] = []

    async def generate_turn(
        self, context: list[int], sampling: RolloutSampling, max_tokens: int, seed: int
    ) -> GeneratedTurn:
        self.contexts.append(list(context))
        self.max_tokens.append(max_tokens)
        await asyncio.sleep(0)
        ids = self.tokenizer.encode(self.scripts[context[0]].pop(0), add_special_tokens=False)
        ids = [*ids, self.eos]
        cut = len(ids) > max_tokens
        ids = ids[:max_tokens]
        return GeneratedTurn(ids, [-0.25] * len(ids), cut)

    def decode(self, token_ids: list[int]) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))


def call(a: Any, b: Any = 1, name: str = "add") -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': {'a': a, 'b': b}})}</tool_call>"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def run_loop(
    tokenizer: Any,
    scripts: dict[int, list[str]],
    tool: Tool | None = None,
    max_tokens: int = 64,
    **limits: Any,
) -> tuple[list[Any], ScriptedPolicy]:
    settings = AgentLoopSettings(**{"max_tool_calls": 4, "max_parallel_calls": 2, **limits})
    policy = ScriptedPolicy(tokenizer, scripts, tokenizer.eos_token_id)
    tools = {"add": tool or Add()}
    loop = AgentLoop(policy, tools, get_parser("hermes"), ToolTurnRenderer(tokenizer), settings)
    prompts = [[k, 5, 6] for k in scripts]
    sampling = RolloutSampling(n=1, max_tokens=max_tokens)
    trajs = asyncio.run(loop.run(prompts, sampling, [0] * len(prompts)))
    return trajs, policy


class Grade(Tool):
    """Grades an answer against the sample's ground truth, which only create() is given (the
    row's ``tools_kwargs``, verl's format)."""

    def __init__(self) -> None:
        super().__init__({}, ToolSchema("grade", "Grades.", {"type": "object"}))
        self.truth: dict[str, str] = {}

    async def create(self, instance_id: str, **create_kwargs: Any) -> None:
        self.truth[instance_id] = create_kwargs["ground_truth"]

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        right = str(arguments["a"]) == self.truth[instance_id]
        return ToolResult("right" if right else "wrong")

    async def release(self, instance_id: str) -> None:
        del self.truth[instance_id]


def test_each_sample_creates_its_tools_with_its_rows_tools_kwargs(tokenizer: Any) -> None:
    grade = Grade()
    settings = AgentLoopSettings(max_tool_calls=1)
    scripts = {3: [call(7, name="grade"), "done"], 4: [call(7, name="grade"), "done"]}
    policy = ScriptedPolicy(tokenizer, scripts, tokenizer.eos_token_id)
    renderer = ToolTurnRenderer(tokenizer)
    loop = AgentLoop(policy, {"grade": grade}, get_parser("hermes"), renderer, settings)
    tools_kwargs = [
        {"grade": {"create_kwargs": {"ground_truth": "7"}}},
        {"grade": {"create_kwargs": {"ground_truth": "8"}}, "other_tool": {}},
    ]
    sampling = RolloutSampling(n=1, max_tokens=64)
    trajs = asyncio.run(loop.run([[3, 5], [4, 5]], sampling, [0, 0], tools_kwargs))
    answers = [tokenizer.decode(t.response_ids[: len(t.loss_mask)]) for t in trajs]
    assert "right" in answers[0] and "wrong" not in answers[0]
    assert "wrong" in answers[1] and "right" not in answers[1]
    assert [t.tool_errors for t in trajs] == [0, 0] and grade.truth == {}  # all released
    with pytest.raises(ValueError, match="1 tools_kwargs for 2 prompts"):
        asyncio.run(loop.run([[3, 5], [4, 5]], sampling, [0, 0], tools_kwargs[:1]))


def test_token_in_token_out_and_the_mask(tokenizer: Any) -> None:
    renderer = ToolTurnRenderer(tokenizer)
    trajs, policy = run_loop(tokenizer, {3: [call(2, 3), "it is 5"]})
    (t,) = trajs
    first = tokenizer.encode(call(2, 3), add_special_tokens=False) + [tokenizer.eos_token_id]
    tool_ids = renderer.ids(["5"])
    second = tokenizer.encode("it is 5", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert t.response_ids == first + tool_ids + second
    assert t.loss_mask == [1] * len(first) + [0] * len(tool_ids) + [1] * len(second)
    assert t.log_probs == [-0.25] * len(first) + [0.0] * len(tool_ids) + [-0.25] * len(second)
    # the second turn saw exactly the prompt and the ids so far, never a re-encoding
    assert policy.contexts[1] == [3, 5, 6, *first, *tool_ids]
    # the tool turn is the chat template's: the text after the model's end-of-turn token
    expected = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": call(2, 3)},
            {"role": "tool", "content": "5"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    rendered = tokenizer.decode(first + tool_ids, skip_special_tokens=False)
    assert expected.endswith(rendered)
    assert t.stop == STOP_MODEL and t.turns == 2 and t.tool_calls == 1
    (row,) = trajectory_rows(trajs, 1)
    assert row.loss_mask == t.loss_mask and row.agent is not None
    assert row.agent.model_tokens == len(first) + len(second)
    assert row.agent.tool_tokens == len(tool_ids)


def test_limits_stop_each_sample_by_name(tokenizer: Any) -> None:
    scripts = {
        3: ["done"],  # stops on its own
        4: [call(1), call(2), call(3), "x"],  # third call is past max_tool_calls=2
        7: ["a" * 200],  # cut by the turn's max_tokens (150)
        8: [call(1), call(2), "b" * 200],  # cut by max_total_response_length
    }
    trajs, _ = run_loop(
        tokenizer, scripts, max_tokens=150, max_tool_calls=2, max_total_response_length=300
    )
    assert [t.stop for t in trajs] == [STOP_MODEL, STOP_CALLS, STOP_LENGTH, STOP_TOTAL]
    assert trajs[1].tool_calls == 2 and trajs[1].turns == 3
    assert trajs[2].finish_reason == "length" and trajs[0].finish_reason == "stop"
    assert len(trajs[3].response_ids) == 300
    metrics = agent_step_metrics([t.stats() for t in trajs])
    assert metrics["agent/stopped/max_tool_calls"] == 1.0
    assert metrics["agent/tool_calls_per_sample"] == 1.0  # 2 + 2 calls over 4 samples


def test_parallel_calls_are_capped_per_turn(tokenizer: Any) -> None:
    trajs, policy = run_loop(
        tokenizer, {3: [call(1) + call(2) + call(3), "ok"]}, max_tokens=256, max_parallel_calls=2
    )
    (t,) = trajs
    assert t.tool_calls == 2
    shown = tokenizer.decode(policy.contexts[1][3:], skip_special_tokens=False)
    assert "2" in shown and "3" in shown and "4" not in shown.split("<|im_start|>tool")[1]


def test_bad_calls_and_failing_tools_are_answered_and_counted(tokenizer: Any) -> None:
    scripts = {
        3: ["<tool_call>{oops}</tool_call>", call(1, name="nope"), "done"],
        4: ['<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "done"],
        7: [call("boom"), call("slow"), "done"],
    }
    tool = Add()
    started = time.perf_counter()
    trajs, policy = run_loop(tokenizer, scripts, tool=tool, max_tokens=128, tool_timeout_s=0.5)
    assert time.perf_counter() - started < 30
    assert [t.stop for t in trajs] == [STOP_MODEL] * 3
    assert trajs[0].bad_calls == 2 and trajs[1].bad_calls == 1
    assert trajs[2].tool_errors == 1 and trajs[2].tool_timeouts == 1
    texts = [tokenizer.decode(c[3:], skip_special_tokens=False) for c in policy.contexts]
    assert any("not valid JSON" in s for s in texts)
    assert any("no tool named 'nope'" in s for s in texts)
    assert any("needs the argument(s) b" in s for s in texts)
    assert any("exploded" in s for s in texts) and any("did not answer" in s for s in texts)
    assert not tool.live  # every instance released, also after failures


def test_a_slow_tool_does_not_stall_other_samples(tokenizer: Any) -> None:
    scripts = {3: [call(1), "done"], **{k: ["x", "y"] for k in range(10, 14)}}
    _, policy = run_loop(tokenizer, scripts, tool=Add(delay=0.3))
    # the four tool-free samples finished their turn before the tool answered
    assert [c[0] for c in policy.contexts[:5]] == [3, 10, 11, 12, 13]
    assert policy.contexts[-1][0] == 3


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        ("left", "abcd...(truncated)"),
        ("right", "(truncated)...ghij"),
        ("middle", "ab...(truncated)...ij"),
    ],
)
def test_tool_answers_are_cut_as_mindspeed_rl_cuts_them(side: str, expected: str) -> None:
    assert truncate_tool_text("abcdefghij", 4, side) == expected
    assert truncate_tool_text("abc", 4, side) == "abc"
    assert truncate_tool_text("abcdefghij", 0, side) == "abcdefghij"


def test_the_loss_mask_reaches_the_batch_response_mask() -> None:
    from mindrl.data.batch import build_sample_batch

    batch = build_sample_batch(
        [[1, 2, 3], [4, 5]],
        [[10, 11, 12, 13], [14, 15]],
        pad_id=0,
        loss_masks=[[1, 0, 0, 1], None],
    )
    # column j predicts token j + 1: the responses start at columns 2 and 1
    assert batch.response_mask.tolist() == [
        [0.0, 0.0, 1.0, 0.0, 0.0, 1.0],
        [0.0, 1.0, 1.0, 0.0, 0.0, 0.0],
    ]
    with pytest.raises(ValueError, match="a loss mask of 1 for 4 tokens"):
        build_sample_batch([[1]], [[2, 3, 4, 5]], pad_id=0, loss_masks=[[1]])
