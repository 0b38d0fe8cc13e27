"""The calculator tool: arithmetic right, everything else refused with a reason, bounded."""

from __future__ import annotations

import asyncio

import pytest

from mindrl.tools.calculator import CalculationError, Calculator, calculate


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("123456789 * 987654321", "121932631112635269"),
        ("(2 + 3) * -4", "-20"),
        ("7 / 2", "3.5"),
        ("8 / 2", "4"),
        ("2 ** 10 % 1000", "24"),
        ("17 // 5", "3"),
    ],
)
def test_arithmetic(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('true')", "only numbers"),
        ("x + 1", "only numbers"),
        ("9 ** 9999", "exponents are limited"),
        ("(10 ** 60) * (10 ** 60)", "more than 60 digits"),
        ("1 / 0", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 300, "limited to 200 characters"),
    ],
)
def test_everything_else_is_refused_with_a_reason(expression: str, reason: str) -> None:
    with pytest.raises(CalculationError, match=reason):
        calculate(expression)


def test_the_tool_answers_errors_as_text() -> None:
    tool = Calculator()
    assert asyncio.run(tool.execute("s", {"expression": "6*7"})).text == "42"
    bad = asyncio.run(tool.execute("s", {"expression": "open('x')"}))
    assert bad.error == "error" and bad.text.startswith("Error: only numbers")
    assert asyncio.run(tool.execute("s", {"expression": 5})).error == "bad_call"
