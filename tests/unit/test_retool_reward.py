"""retool_reward: MindSpeed-RL's scores, on the strict-box cases of its math_dapo tests.

MindSpeed-RL's `retool_reward` is `compute_score(response, label, strict_box_verify=True)`
(1 / -1) and, on a miss, 0.1 per tool call, capped at 0. Its unit tests
(tests/ut/models/test_math_dapo.py) give the strict-box cases reused here.
"""

from __future__ import annotations

import pytest

from mindrl.rewards.registry import get_verifier
from mindrl.rewards.types import SampleMeta

retool_reward = get_verifier("retool_reward")


def calls(n: int | None) -> SampleMeta:
    return SampleMeta(tool_calls=n)


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        ("Some text \\boxed{2x + 3}", "2x + 3", 1.0),  # test_is_correct_strict_box_correct
        ("Some text \\boxed{2x + 4}", "2x + 3", -1.0),  # ..._incorrect
        ("Some text without boxed answer", "2x + 3", -1.0),  # ..._no_box
        ("Some text \\boxed{ 2x + 3}", "2x + 3", -1.0),  # compared as is: no stripping
        (
            "\\boxed{1} then \\boxed{\\frac{1}{2}}",
            "\\frac{1}{2}",
            1.0,
        ),  # the last box, braces matched
        ("\\boxed{7}" + " filler" * 20, "7", -1.0),  # the box must sit in the last 100 characters
        ("\\boxed{7}" + "x" * 92, "7", -1.0),  # 101 characters: the box is cut
        ("\\boxed{7}" + "x" * 91, "7", 1.0),  # 100 characters: kept
    ],
)
def test_strict_box_scores(response: str, label: str, expected: float) -> None:
    assert retool_reward(response, label) == expected
    assert retool_reward(response, label, calls(None)) == expected


@pytest.mark.parametrize(
    ("n_calls", "expected"),
    [(0, -1.0), (1, -0.9), (3, -0.7), (10, 0.0), (25, 0.0)],
)
def test_tool_calls_raise_a_miss_towards_zero(n_calls: int, expected: float) -> None:
    assert retool_reward("no box", "5", calls(n_calls)) == pytest.approx(expected)


def test_tool_calls_add_nothing_to_a_correct_answer() -> None:
    assert retool_reward("\\boxed{5}", "5", calls(4)) == 1.0
