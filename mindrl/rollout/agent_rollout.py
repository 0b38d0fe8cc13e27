"""Multi-turn rollout on a generating worker (hybrid engine or rollout worker): the tools, the
tokenizer's chat template and the agent loop, built once from the run's config and used for
every step's prompts."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindrl.config.multi_turn import tool_config_file, tool_parser_name
from mindrl.rollout.agent_loop import AgentLoop, AgentLoopSettings, trajectory_rows
from mindrl.rollout.agent_turns import ToolTurnRenderer

if TYPE_CHECKING:
    from mindrl.config.rl_features import RolloutModeConfig
    from mindrl.data.tool_kwargs import ToolsKwargs
    from mindrl.rollout.base import RolloutEngine, RolloutRow, RolloutSampling
    from mindrl.tools.base import Tool


def loop_settings(mode: RolloutModeConfig) -> AgentLoopSettings:
    """`rl_config`'s multi-turn keys (checked by `mindrl.config.multi_turn`) as loop limits."""
    return AgentLoopSettings(
        max_tool_calls=mode.max_tool_calls,
        max_parallel_calls=mode.max_parallel_calls,
        max_total_response_length=mode.max_total_response_length,
        max_tool_response_length=mode.max_tool_response_length,
        tool_response_truncate_side=mode.tool_response_truncate_side,
        tool_timeout_s=mode.tool_call_timeout,
    )


class AgentRollout:
    """Generates multi-turn responses on a vLLM engine; owns the tools and their event loop
    (one loop for the run, so a tool's clients and servers live as long as it does)."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        tokenizer: Any,
        settings: AgentLoopSettings,
        parser_name: str = "hermes",
    ) -> None:
        from mindrl.tools.parsers import get_parser

        self.tools = dict(tools)
        self.tokenizer = tokenizer
        self.settings = settings
        self.parser = get_parser(parser_name)
        self.renderer = ToolTurnRenderer(tokenizer)
        self._loop = asyncio.new_event_loop()

    @classmethod
    def from_config(cls, mode: RolloutModeConfig, tokenizer_dir: str | Path) -> AgentRollout:
        from transformers import AutoTokenizer

        from mindrl.tools.registry import load_tools

        if not mode.tool_config_path:
            raise ValueError("multi_turn_enable needs rl_config.tool_config_path")
        tools = load_tools(tool_config_file(mode.tool_config_path))
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        return cls(tools, tokenizer, loop_settings(mode), tool_parser_name(mode.tool_parser_format))

    def generate(
        self,
        engine: RolloutEngine,
        prompts: list[list[int]],
        sampling: RolloutSampling,
        tools_kwargs: list[ToolsKwargs] | None = None,
    ) -> list[RolloutRow]:
        """``sampling.n`` multi-turn responses per prompt, ordered by (prompt, sample); the
        tools of a prompt's samples are created with its ``tools_kwargs``."""
        from mindrl.rollout.vllm_engine import VLLMRolloutEngine
        from mindrl.rollout.vllm_turns import VLLMTurnPolicy

        if not isinstance(engine, VLLMRolloutEngine):
            raise RuntimeError(
                f"multi-turn rollout (rl_config.multi_turn_enable) runs on vLLM; this worker's "
                f"engine is {engine.backend!r} (vLLM is not usable here, or "
                "generate_config.rollout_backend chose another)"
            )
        seeds = engine.start_call(prompts, sampling)
        policy = VLLMTurnPolicy(engine, self.tokenizer)
        agent = AgentLoop(policy, self.tools, self.parser, self.renderer, self.settings)
        try:
            trajectories = self._loop.run_until_complete(
                agent.run(prompts, sampling, seeds, tools_kwargs)
            )
        finally:
            policy.close()
        return trajectory_rows(trajectories, sampling.n)

    def close(self) -> None:
        """Close every tool (their servers, clients), then the event loop."""
        if self._loop.is_closed():
            return
        try:
            for tool in self.tools.values():
                self._loop.run_until_complete(tool.close())
        finally:
            self._loop.close()
