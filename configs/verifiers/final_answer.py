"""Exact match of a multi-turn response's last turn, for the calculator task
(`grpo_tool_tiny_cpu`).

The scorer sees the whole response with special tokens skipped: model turns, and tool turns
that read ``tool\\n<answer>\\nassistant\\n`` once the chat template's markers are gone. Only
the text after the last assistant header counts, so a number in the tool call or in the
tool's answer scores nothing by itself: the model has to write the product as its answer.
Loaded through `rl_config.verifier_files`.
"""

from mindrl.rewards.registry import register_verifier

ASSISTANT_HEADER = "assistant\n"


@register_verifier("final_answer_exact")
def final_answer_exact(response: str, label: str, meta=None) -> float:
    final = response.rsplit(ASSISTANT_HEADER, 1)[-1].strip()
    return 1.0 if final == label.strip() else 0.0
