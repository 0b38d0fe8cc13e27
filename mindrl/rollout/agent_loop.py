"""The agent loop: per sample, generate -> parse tool calls -> run them -> append the answers -> again.

All samples of a call run as coroutines on one event loop against one `TurnPolicy`, which
batches whatever turns are waiting into the engine's next step (continuous batching): a sample
whose tool is still running holds nothing up, the others keep generating. Limits follow
MindSpeed-RL's ``rl_config`` keys: ``max_tool_calls`` per sample, ``max_parallel_calls`` per turn
(calls beyond it in one turn are not run), ``max_total_response_length`` over all turns (a tool
turn that would reach it ends the sample instead), ``max_tool_response_length`` characters of
each answer cut at ``tool_response_truncate_side``. Ray-free: the hybrid engine and the rollout
worker both call `run_agent_rollout`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mindrl.data.tool_kwargs import create_kwargs
from mindrl.rollout.agent_turns import (
    STOP_CALLS,
    STOP_LENGTH,
    STOP_MODEL,
    STOP_TOTAL,
    ToolTurnRenderer,
    Trajectory,
    truncate_tool_text,
)
from mindrl.rollout.base import RolloutRow, RolloutSampling
from mindrl.tools.base import Tool, ToolCall, ToolResult
from mindrl.tools.parsers import ToolCallParser

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GeneratedTurn:
    """One model turn as the engine produced it."""

    token_ids: list[int]
    log_probs: list[float]
    cut: bool  # ended at max_tokens rather than on a stop token


class TurnPolicy(Protocol):
    """Generates one turn of one sample; many calls may be in flight at once."""

    async def generate_turn(
        self, context: list[int], sampling: RolloutSampling, max_tokens: int, seed: int
    ) -> GeneratedTurn: ...

    def decode(self, token_ids: list[int]) -> str: ...


@dataclass(frozen=True)
class AgentLoopSettings:
    """The loop's limits (``rl_config``'s multi-turn keys, checked at config time)."""

    max_tool_calls: int = 1
    max_parallel_calls: int = 1
    max_total_response_length: int = 1024
    max_tool_response_length: int = 256
    tool_response_truncate_side: str | None = "middle"
    tool_timeout_s: float = 30.0


def _seed(base: int, sample: int, turn: int) -> int:
    """A per-(sample, turn) request seed, so a rollout repeats given the call's seed."""
    return (base + sample * 1_000_003 + turn * 7_919) % (1 << 62)


class AgentLoop:
    """Runs the samples of one rollout call concurrently; the tools are shared by all of them."""

    def __init__(
        self,
        policy: TurnPolicy,
        tools: Mapping[str, Tool],
        parser: ToolCallParser,
        renderer: ToolTurnRenderer,
        settings: AgentLoopSettings,
    ) -> None:
        self.policy = policy
        self.tools = dict(tools)
        self.parser = parser
        self.renderer = renderer
        self.settings = settings
        self._instances = 0

    async def run(
        self,
        prompts: Sequence[list[int]],
        sampling: RolloutSampling,
        prompt_seeds: Sequence[int],
        tools_kwargs: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Trajectory]:
        """``sampling.n`` trajectories per prompt, ordered by (prompt, sample); each sample's
        tools are created with its prompt's ``tools_kwargs`` (`mindrl.data.tool_kwargs`)."""
        if tools_kwargs is not None and len(tools_kwargs) != len(prompts):
            raise ValueError(f"{len(tools_kwargs)} tools_kwargs for {len(prompts)} prompts")
        jobs = []
        for p, prompt in enumerate(prompts):
            kwargs = tools_kwargs[p] if tools_kwargs is not None else None
            for i in range(sampling.n):
                seed = _seed(prompt_seeds[p], i, 0)
                jobs.append(self.run_sample(list(prompt), sampling, seed, kwargs))
        return list(await asyncio.gather(*jobs))

    async def run_sample(
        self,
        prompt: list[int],
        sampling: RolloutSampling,
        seed: int,
        tools_kwargs: Mapping[str, Any] | None = None,
    ) -> Trajectory:
        self._instances += 1
        instance_id = f"sample-{self._instances}"
        created: list[Tool] = []
        unusable: dict[str, str] = {}  # tools whose create() failed: their calls answer why
        traj = Trajectory(prompt_ids=prompt)
        try:
            for name, tool in self.tools.items():
                kwargs = create_kwargs(tools_kwargs, name)
                failure = await self._bounded(tool.create(instance_id, **kwargs), name, "create")
                if failure is None:
                    created.append(tool)
                else:
                    unusable[name] = failure
                    traj.tool_errors += 1
            await self._loop(traj, sampling, seed, instance_id, unusable)
        finally:
            for tool in created:
                failure = await self._bounded(tool.release(instance_id), tool.name, "release")
                if failure is not None:
                    logger.warning("%s (sample %s)", failure, instance_id)
                    traj.tool_errors += 1
        return traj

    async def _bounded(self, step: Awaitable[None], tool: str, what: str) -> str | None:
        """A tool's create() / release(), bounded by the call timeout: None when it finished,
        else why not (a failing tool costs its sample's calls, never the rollout)."""
        timeout = self.settings.tool_timeout_s
        try:
            await asyncio.wait_for(step, timeout)
        except asyncio.TimeoutError:
            return f"{tool}.{what}() did not finish within {timeout:g} s"
        except Exception as exc:  # a tool's own failure must not end the rollout
            return f"{tool}.{what}() failed: {exc!r}"[:500]
        return None

    async def _loop(
        self,
        traj: Trajectory,
        sampling: RolloutSampling,
        seed: int,
        instance_id: str,
        unusable: Mapping[str, str],
    ) -> None:
        limits = self.settings
        while True:
            budget = limits.max_total_response_length - len(traj.response_ids)
            max_tokens = min(sampling.max_tokens, budget)
            turn = await self.policy.generate_turn(
                traj.context, sampling, max_tokens, _seed(seed, 0, traj.turns)
            )
            traj.add_model_turn(turn.token_ids, turn.log_probs, turn.cut)
            if turn.cut:
                traj.stop = STOP_TOTAL if max_tokens < sampling.max_tokens else STOP_LENGTH
                return
            parsed = self.parser.parse(self.policy.decode(turn.token_ids))
            if not parsed.asked_for_tools:
                traj.stop = STOP_MODEL
                return
            remaining = limits.max_tool_calls - traj.tool_calls
            if remaining <= 0:
                traj.stop = STOP_CALLS
                return
            answers = list(parsed.errors)
            traj.bad_calls += len(parsed.errors)
            traj.tool_calls += len(parsed.errors)
            calls = parsed.calls[: max(0, min(limits.max_parallel_calls, remaining) - len(answers))]
            traj.tool_calls += len(calls)
            started = time.perf_counter()
            results = await asyncio.gather(*(self._call(c, instance_id, unusable) for c in calls))
            traj.tool_seconds += time.perf_counter() - started
            for result in results:
                traj.bad_calls += result.error == "bad_call"
                traj.tool_timeouts += result.error == "timeout"
                traj.tool_errors += result.error not in (None, "bad_call", "timeout")
                answers.append(result.text)
            cut = [
                truncate_tool_text(
                    a, limits.max_tool_response_length, limits.tool_response_truncate_side
                )
                for a in answers
            ]
            ids = self.renderer.ids(cut)
            if len(traj.response_ids) + len(ids) >= limits.max_total_response_length:
                traj.stop = STOP_TOTAL
                return
            traj.add_tool_turn(ids)

    async def _call(
        self, call: ToolCall, instance_id: str, unusable: Mapping[str, str]
    ) -> ToolResult:
        """One call, bounded; the model's mistakes and the tool's failures become error texts."""
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(
                f"Error: there is no tool named {call.name!r} (tools: {known}).", error="bad_call"
            )
        if call.name in unusable:
            return ToolResult(f"Error: {unusable[call.name]}.", error="error")
        missing = [a for a in tool.schema.required if a not in call.arguments]
        if missing:
            return ToolResult(
                f"Error: {call.name} needs the argument(s) {', '.join(missing)}.", error="bad_call"
            )
        timeout = self.settings.tool_timeout_s
        try:
            return await asyncio.wait_for(tool.execute(instance_id, call.arguments), timeout)
        except asyncio.TimeoutError:
            return ToolResult(
                f"Error: {call.name} did not answer within {timeout:g} s.", error="timeout"
            )
        except Exception as exc:  # a tool's own failure must not end the rollout
            return ToolResult(f"Error: {call.name} failed: {exc!r}"[:500], error="error")


def trajectory_rows(trajectories: Sequence[Trajectory], n: int) -> list[RolloutRow]:
    """Trajectories (ordered by prompt, then sample) as the rows a generating worker returns."""
    return [
        RolloutRow(
            prompt_index=k // n,
            token_ids=list(t.response_ids),
            log_probs=list(t.log_probs),
            finish_reason=t.finish_reason,
            loss_mask=list(t.loss_mask),
            agent=t.stats(),
        )
        for k, t in enumerate(trajectories)
    ]
