"""Built-in rule verifiers, registered under MindSpeed-RL's and ms-swift's names.

Each follows the contract in `mindrl.rewards.types`: `(response, label, meta) -> float`.

| name            | value                                   | origin                          |
|-----------------|-----------------------------------------|---------------------------------|
| acc / accuracy  | 1 if the extracted answer is right, 0   | ms-swift `accuracy`             |
| base_acc        | 1 if R1 layout + boxed answer right, 0  | MindSpeed-RL `base_acc`         |
| format          | 1 if `<think>..</think><answer>..</answer>`, 0 (loose) | ms-swift `format` |
| strict_format   | 1 if the exact R1 layout, else -0.5     | MindSpeed-RL `strict_format`    |
| cosine          | length-scaled correctness in [min, max] | ms-swift `cosine`               |
| repetition      | n-gram repetition penalty in [max_penalty, 0] | ms-swift `repetition`     |
| soft_overlong   | DAPO soft overlong punishment in [-1, 0] | DAPO / ms-swift `soft_overlong` |

acc vs base_acc: `acc` grades the answer wherever and however the response states it
(boxed, `<answer>`, `#### N`, last number) and ignores layout, so it is the plain accuracy of
a run. `base_acc` is MindSpeed-RL's reward for base models trained with the R1 template: the
response must be `<think>...</think> ... <answer> ... \\boxed{X} ... </answer>` and only the
boxed `X` inside the answer block is graded; anything else scores 0.
"""

from __future__ import annotations

import math
import re

from mindrl.rewards.extraction import (
    all_boxed,
    answers_match,
    extract_answer,
    extract_label,
    last_boxed,
)
from mindrl.rewards.types import RewardParams, SampleMeta
from mindrl.rewards.verifier_table import register_verifier

_LOOSE_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_R1_LAYOUT = re.compile(r"<think>.*</think>.*<answer>(.*)</answer>", re.DOTALL)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"

STRICT_FORMAT_PASS = 1.0
STRICT_FORMAT_FAIL = -0.5  # MindSpeed-RL's value for a malformed response


def _params(meta: SampleMeta | None) -> RewardParams:
    return meta.params if meta is not None else RewardParams()


def _required(value: int | None, what: str) -> int:
    if value is None:
        raise ValueError(f"this verifier needs {what}")
    return value


# ---------------------------------------------------------------------------- accuracy


def is_correct(response: str, label: str) -> bool:
    """The lenient correctness test shared by `acc` and `cosine`."""
    return answers_match(extract_answer(response), extract_label(label))


@register_verifier("acc")
def acc(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """1.0 when the response's final answer equals the label, else 0.0."""
    return 1.0 if is_correct(response, label) else 0.0


register_verifier("accuracy")(acc)  # ms-swift's name for the same reward


@register_verifier("base_acc")
def base_acc(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """1.0 when the R1 layout holds and the boxed answer inside <answer> is right."""
    layout = _R1_LAYOUT.fullmatch(response.strip())
    if layout is None:
        return 0.0
    boxed = last_boxed(layout.group(1))
    return 1.0 if answers_match(boxed, extract_label(label)) else 0.0


# ---------------------------------------------------------------------------- format


def loose_format_ok(response: str) -> bool:
    """ms-swift `format`: starts with a think block, ends with an answer block."""
    return _LOOSE_FORMAT.fullmatch(response.strip()) is not None


def strict_format_ok(response: str, require_boxed: bool = True) -> bool:
    """MindSpeed-RL `strict_format`: exactly `<think>A</think>` + `<answer>B</answer>`.

    Starts with `<think>`, ends with `</answer>` (nothing after), each tag exactly once,
    only whitespace between the two blocks; with `require_boxed`, exactly one `\\boxed{}` in
    the response and it sits inside the answer block. Passing implies `loose_format_ok`.
    """
    if not (response.startswith(_THINK_OPEN) and response.endswith(_ANSWER_CLOSE)):
        return False
    tags = (_THINK_OPEN, _THINK_CLOSE, _ANSWER_OPEN, _ANSWER_CLOSE)
    if any(response.count(tag) != 1 for tag in tags):
        return False
    think_end = response.index(_THINK_CLOSE)
    answer_start = response.index(_ANSWER_OPEN)
    if answer_start < think_end or response[think_end + len(_THINK_CLOSE) : answer_start].strip():
        return False
    if require_boxed:
        body = response[answer_start + len(_ANSWER_OPEN) : -len(_ANSWER_CLOSE)]
        return len(all_boxed(response)) == 1 and len(all_boxed(body)) == 1
    return True


@register_verifier("format")
def format_reward(response: str, label: str, meta: SampleMeta | None = None) -> float:
    return 1.0 if loose_format_ok(response) else 0.0


@register_verifier("strict_format")
def strict_format(response: str, label: str, meta: SampleMeta | None = None) -> float:
    ok = strict_format_ok(response, _params(meta).strict_format_require_boxed)
    return STRICT_FORMAT_PASS if ok else STRICT_FORMAT_FAIL


# ---------------------------------------------------------------------------- length-aware


def cosine_value(length: int, max_len: int, value_at_zero: float, value_at_max: float) -> float:
    """Half-cosine from `value_at_zero` (length 0) to `value_at_max` (length >= max_len).

    Same curve as ms-swift's cosfn, clamped at max_len (ms-swift's curve turns back up
    beyond it, which would reward over-long answers again).
    """
    t = min(max(length, 0), max_len)
    return (
        value_at_max + (value_at_zero - value_at_max) * (1.0 + math.cos(math.pi * t / max_len)) / 2
    )


@register_verifier("cosine")
def cosine(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """Correct answers earn more when short, wrong ones lose less when long."""
    params = _params(meta)
    length = _required(meta.response_length if meta else None, "meta.response_length")
    max_len = _required(
        params.cosine_max_len or (meta.max_length if meta else None),
        "cosine_max_len or meta.max_length",
    )
    if is_correct(response, label):
        return cosine_value(
            length,
            max_len,
            params.cosine_min_len_value_correct,
            params.cosine_max_len_value_correct,
        )
    return cosine_value(
        length, max_len, params.cosine_min_len_value_wrong, params.cosine_max_len_value_wrong
    )


def repetition_penalty(text: str, n: int, max_penalty: float) -> float:
    """ms-swift's repetition reward: (1 - distinct/total word n-grams) * max_penalty."""
    words = text.lower().split()
    if len(words) < n:
        return 0.0
    ngrams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return (1.0 - len(set(ngrams)) / len(ngrams)) * max_penalty


@register_verifier("repetition")
def repetition(response: str, label: str, meta: SampleMeta | None = None) -> float:
    params = _params(meta)
    return repetition_penalty(response, params.repetition_n_grams, params.repetition_max_penalty)


def soft_overlong_value(length: int, max_length: int, cache_length: int) -> float:
    """DAPO eq. 13: 0 up to max-cache, then linear down to -1 at max, -1 beyond."""
    expected = max_length - cache_length
    if length <= expected:
        return 0.0
    if length <= max_length:
        return (expected - length) / cache_length
    return -1.0


@register_verifier("soft_overlong")
def soft_overlong(response: str, label: str, meta: SampleMeta | None = None) -> float:
    params = _params(meta)
    length = _required(meta.response_length if meta else None, "meta.response_length")
    max_length = _required(
        params.soft_max_length or (meta.max_length if meta else None),
        "soft_max_length or meta.max_length",
    )
    cache = _required(params.soft_cache_length, "soft_cache_length")
    if cache > max_length:
        raise ValueError(f"soft_cache_length {cache} exceeds max length {max_length}")
    return soft_overlong_value(length, max_length, cache)


# Which metadata a verifier cannot work without; the scorer checks it before dispatching.
cosine.required_meta = ("response_length",)  # type: ignore[attr-defined]
soft_overlong.required_meta = ("response_length",)  # type: ignore[attr-defined]
