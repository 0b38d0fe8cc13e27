"""MindSpeed-RL's rule verifiers, under its names and with its values.

| name               | correct / wrong / no answer | rule                                                |
|--------------------|-----------------------------|-----------------------------------------------------|
| acc                | 1 / -0.5 / -1               | toolkit extraction + `math_equal`; -1 without `boxed` |
| base_acc           | 1 / 0 / 0                   | R1 layout with a `\\boxed{}` in <answer>, last box graded |
| math_verify_reward | 1 / 0 / 0                   | same layout, graded by math-verify                  |
| math_17k_acc       | 1 / 0 / 0                   | last `\\boxed{}` anywhere, PRM800K grader            |
| acc_for_ppo        | 1 / 0 / 0                   | same as math_17k_acc                                |
| acc_for_dapo       | 1 / -1 / -1                 | last `Answer: X` line (a bare `\\boxed{}` scores -1) |
| format             | 1 / 0                       | `<think>..</think>` ws `<answer>..</answer>` (then a line break may follow) |
| strict_format      | 1 / -0.5                    | each tag once, one box, ordered, exact start / end  |
| step               | min(1, markers / 3)         | `Step N:`, `First,` ... counted                      |
| retool_reward      | 1 / -1 + 0.1 x calls (<= 0) / same | last `\\boxed{}` in the last 100 of the last 300 characters, equal to the label as is |

Each reads the response as given (no stripping): a leading space or a trailing newline
changes `base_acc`, `format` and `strict_format` exactly as in MindSpeed-RL. Labels are
compared as given too (a `#### 72` label is not reduced to `72`). Where MindSpeed-RL
scores a timed-out or failing call 0, mindrl's verifier pool does the same.
"""

from __future__ import annotations

import re
import threading

from mindrl.rewards.boxed_grader import grade_answer, last_boxed_content
from mindrl.rewards.math_eval_answer import extract_final_answer
from mindrl.rewards.math_eval_equal import math_equal
from mindrl.rewards.minerva_answer import minerva_score
from mindrl.rewards.types import SampleMeta
from mindrl.rewards.verifier_table import register_verifier

ACC_CORRECT, ACC_WRONG, ACC_NO_BOX = 1.0, -0.5, -1.0
STRICT_FORMAT_PASS, STRICT_FORMAT_FAIL = 1.0, -0.5
RETOOL_CORRECT, RETOOL_WRONG, RETOOL_CALL_BONUS = 1.0, -1.0, 0.1
_RETOOL_TAIL, _RETOOL_BOX_TAIL = 300, 100

_CHAT_START = "<|im_start|>assistant"
_STOP_WORDS = ("</s>", "<|im_end|>", "<|endoftext|>")
_FORMAT = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL | re.MULTILINE)
_BOXED_ONE_LINE = re.compile(r"\\boxed\{.*?\}")
_STEP_MARKERS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


# ---------------------------------------------------------------------------- acc


def acc_answer_text(response: str) -> str:
    """The part of a response `acc` reads: from the first assistant turn to a stop word."""
    start = response.find(_CHAT_START)
    text = response[start:] if start != -1 else response
    for stop in _STOP_WORDS:
        if stop in text:
            text = text.split(stop)[0].strip()
    return text


@register_verifier("acc")
def acc(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """1 right, -0.5 wrong, -1 when no answer is found or the text has no `boxed`."""
    text = acc_answer_text(response)
    answer = extract_final_answer(text)
    if not answer or "boxed" not in text:
        return ACC_NO_BOX
    return ACC_CORRECT if math_equal(answer, label) else ACC_WRONG


# ---------------------------------------------------------------------------- boxed graders


def r1_boxed_layout(response: str) -> bool:
    """`<think>.*</think>.*<answer>.*\\boxed{.*}.*</answer>`, the whole response (DOTALL).

    Checked with leftmost finds, which is the same test as the full match and linear.
    """
    if not response.startswith("<think>"):
        return False
    pos = len("<think>")
    for token in ("</think>", "<answer>", "\\boxed{", "}"):
        pos = response.find(token, pos)
        if pos == -1:
            return False
        pos += len(token)
    return response.endswith("</answer>") and pos <= len(response) - len("</answer>")


@register_verifier("base_acc")
def base_acc(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """1.0 when the R1 layout holds and the last `\\boxed{}` grades equal to the label."""
    ok = r1_boxed_layout(response) and grade_answer(last_boxed_content(response), label)
    return 1.0 if ok else 0.0


@register_verifier("math_17k_acc")
def math_17k_acc(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """1.0 when the last `\\boxed{}` of the response grades equal to the label."""
    return 1.0 if grade_answer(last_boxed_content(response), label) else 0.0


register_verifier("acc_for_ppo")(math_17k_acc)  # MindSpeed-RL's PPO name, the same rule


@register_verifier("acc_for_dapo")
def acc_for_dapo(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """DAPO's Minerva check of the last `Answer: X` line: 1.0 or -1.0."""
    return minerva_score(response, label)


@register_verifier("retool_reward")
def retool_reward(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """MindSpeed-RL's ReTool reward: DAPO's strict box check, and 0.1 per tool call on a miss.

    Correct (the last `\\boxed{}` in the response's last 100 of its last 300 characters holds
    exactly the label): 1. Otherwise -1, raised by 0.1 per tool call the sample made
    (`meta.tool_calls`, filled by the agent loop) but never above 0. Without a count the
    bonus is not given, as in MindSpeed-RL when its rollout passes no counts.
    """
    answer = last_boxed_content(response[-_RETOOL_TAIL:][-_RETOOL_BOX_TAIL:], strip=False)
    score = RETOOL_CORRECT if answer is not None and answer == label else RETOOL_WRONG
    calls = meta.tool_calls if meta is not None else None
    if calls and score < 0:
        score = min(0.0, score + calls * RETOOL_CALL_BONUS)
    return score


@register_verifier("math_verify_reward")
def math_verify_reward(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """R1 layout, then math-verify: gold `\\boxed{label}` against the whole response."""
    if not r1_boxed_layout(response):
        return 0.0
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # math-verify's timeouts use SIGALRM, which only a main thread may set; the verifier
    # pool bounds every call anyway.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse("\\boxed{" + label + "}", [LatexExtractionConfig()], parsing_timeout=limit)
        if not gold:
            return 0.0
        pred = parse(
            response, [ExprExtractionConfig(), LatexExtractionConfig()], parsing_timeout=limit
        )
        return 1.0 if verify(gold, pred, float_rounding=6, timeout_seconds=limit) else 0.0
    except Exception:  # MindSpeed-RL scores math-verify's failures 0
        return 0.0


# ---------------------------------------------------------------------------- format / steps


@register_verifier("format")
def format_reward(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """1.0 for `<think>..</think>` + whitespace + `<answer>..</answer>` from the first
    character; the answer block must end the text or a line."""
    return 1.0 if _FORMAT.match(response) else 0.0


def strict_format_ok(response: str, require_boxed: bool = True) -> bool:
    """Each of the four tags exactly once, in order, starting the text with `<think>` and
    ending it with `</answer>`; with `require_boxed`, exactly one one-line `\\boxed{...}`,
    placed between `<answer>` and `</answer>` (by first occurrences). Text between
    `</think>` and `<answer>` is allowed, as in MindSpeed-RL."""
    if not (response.startswith("<think>") and response.endswith("</answer>")):
        return False
    if any(response.count(tag) != 1 for tag in _TAGS):
        return False
    think_start, think_end, answer_start, answer_end = (response.find(t) for t in _TAGS)
    if not think_start <= think_end <= answer_start <= answer_end:
        return False
    if not require_boxed:
        return True
    boxes = list(_BOXED_ONE_LINE.finditer(response))
    return len(boxes) == 1 and answer_start <= boxes[0].start() <= answer_end


@register_verifier("strict_format")
def strict_format(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """1.0 for the exact R1 layout, else -0.5 (`strict_format_require_boxed: false` drops
    the one-box rule, a mindrl option)."""
    require_boxed = meta.params.strict_format_require_boxed if meta is not None else True
    return STRICT_FORMAT_PASS if strict_format_ok(response, require_boxed) else STRICT_FORMAT_FAIL


@register_verifier("step")
def step(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """Reasoning-step markers (`Step 1:`, a leading `1.`, `\\n-`, `\\n*`, `First,`,
    `Second,`, `Next,`, `Finally,`) counted: min(1, count / 3)."""
    return min(1.0, len(_STEP_MARKERS.findall(response)) / 3)
