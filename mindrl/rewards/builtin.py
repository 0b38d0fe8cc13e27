"""Built-in rule verifiers: MindSpeed-RL's (registered by `mindspeed_verifiers`) and mindrl's.

Each follows the contract in `mindrl.rewards.types`: `(response, label, meta) -> float`.
MindSpeed-RL's names (`acc`, `base_acc`, `format`, `strict_format`, `step`, `math_17k_acc`,
`acc_for_ppo`, `acc_for_dapo`, `math_verify_reward`) score exactly as there; see
`mindspeed_verifiers`. Registered here:

| name                    | value                                         | origin                 |
|-------------------------|-----------------------------------------------|------------------------|
| lenient_acc / accuracy  | 1 if the extracted answer is right, else 0    | mindrl / ms-swift `accuracy` |
| cosine                  | length-scaled correctness in [min, max]       | ms-swift `cosine`      |
| repetition              | n-gram repetition penalty in [max_penalty, 0] | ms-swift `repetition`  |
| soft_overlong           | DAPO soft overlong punishment in [-1, 0]      | DAPO / ms-swift `soft_overlong` |

lenient_acc vs MindSpeed-RL's acc: `lenient_acc` (mindrl's `acc` before it took
MindSpeed-RL's values) grades the answer wherever and however the response states it
(last boxed, `<answer>`, `#### N`, last number), reduces `#### N` / `\\boxed{}` labels, and
scores 1 / 0. `acc` scores 1 / -0.5 / -1 and needs a `boxed` answer.
"""

from __future__ import annotations

import math

from mindrl.rewards import mindspeed_verifiers  # noqa: F401  (registers MindSpeed-RL's names)
from mindrl.rewards.extraction import answers_match, extract_answer, extract_label
from mindrl.rewards.types import RewardParams, SampleMeta
from mindrl.rewards.verifier_table import register_verifier


def _params(meta: SampleMeta | None) -> RewardParams:
    return meta.params if meta is not None else RewardParams()


def _required(value: int | None, what: str) -> int:
    if value is None:
        raise ValueError(f"this verifier needs {what}")
    return value


# ---------------------------------------------------------------------------- accuracy


def is_correct(response: str, label: str) -> bool:
    """The lenient correctness test shared by `lenient_acc` and `cosine`."""
    return answers_match(extract_answer(response), extract_label(label))


@register_verifier("lenient_acc")
def lenient_acc(response: str, label: str, meta: SampleMeta | None = None) -> float:
    """1.0 when the response's final answer equals the label, else 0.0."""
    return 1.0 if is_correct(response, label) else 0.0


register_verifier("accuracy")(lenient_acc)  # ms-swift's name for the same reward


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
