"""Answer extraction and equivalence, against hand-written cases."""

from fractions import Fraction

import pytest

from mindrl.rewards.extraction import (
    all_boxed,
    answers_match,
    extract_answer,
    extract_label,
    gsm8k_answer,
    last_boxed,
    last_number,
    math_verify_available,
    normalize_answer,
    parse_number,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so the area is \boxed{\frac{1}{\sqrt{2}}}.", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{a_{n+1}} and more", "a_{n+1}"),
        (r"first \boxed{3}, finally \boxed{\{1, 2\}}", r"\{1, 2\}"),  # last, escaped braces
        (r"\boxed{{{x}}}", "{{x}}"),
        (r"\fbox{7}", "7"),
        (r"\boxed 5 is it", "5"),
        (r"\boxed{unclosed {x}", None),
        ("no box here", None),
    ],
)
def test_last_boxed_handles_nesting(text, expected):
    assert last_boxed(text) == expected


def test_all_boxed_in_order():
    assert all_boxed(r"\boxed{1} x \fbox{2} y \boxed{\frac{3}{4}}") == ["1", "2", r"\frac{3}{4}"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("48/2 = 24 clips in May; 48 + 24 = 72\n#### 72", "72"),
        ("#### 1,000", "1,000"),
        ("#### -5\nextra line", "-5"),
        ("#### $18", "18"),
        ("no marker", None),
    ],
)
def test_gsm8k_marker(text, expected):
    assert gsm8k_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("the result is -7.", "-7"),
        ("from 3-5 we get", "5"),  # binary minus is not a sign
        ("pay $1,234.50 in total", "1,234.50"),
        ("half is .5", ".5"),
        ("x_1 = 4 and y2", "4"),
        ("nothing numeric", None),
    ],
)
def test_last_number(text, expected):
    assert last_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        # boxed wins over everything else
        (r"<answer>7</answer> but \boxed{8}", "8"),
        # answer tag: a bare answer is kept whole, a sentence gives its number
        ("<think>try 12</think><answer>x = 5</answer>", "x = 5"),
        ("<think>12</think><answer>The answer is 18 dollars.</answer>", "18"),
        (r"<answer>$\frac{3}{4}$</answer>", r"\frac{3}{4}"),
        ("<answer>yes</answer>", "yes"),
        # GSM8K marker beats the last number
        ("#### 72\nchecked with 3 methods", "72"),
        # last number fallback
        ("So she has 5 apples left", "5"),
        ("I cannot solve this.", None),
        ("", None),
    ],
)
def test_extract_answer_order(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "label, expected",
    [
        ("Natalia sold 24 clips in May.\n#### 72", "72"),
        (r"The answer is $\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
        ("  42 ", "42"),
        ("$-3$", "-3"),
        (
            "a long solution with 3 numbers 4 5 but no marker",
            "a long solution with 3 numbers 4 5 but no marker",
        ),
        ("   ", None),
    ],
)
def test_extract_label(label, expected):
    assert extract_label(label) == expected


def test_normalize_answer():
    assert normalize_answer(r"$\dfrac{1}{2}$") == r"\frac{1}{2}"
    assert normalize_answer(r"\text{ 5 }.") == "5"
    assert normalize_answer(r"90^\circ") == "90"
    assert normalize_answer("x = 5") == "5"
    assert normalize_answer(r"\left( 1, 2 \right)") == "(1,2)"


@pytest.mark.parametrize(
    "text, value",
    [
        ("1,000", Fraction(1000)),
        ("-1,234.5", Fraction(-2469, 2)),
        ("3.0", Fraction(3)),
        ("0.5", Fraction(1, 2)),
        ("1/2", Fraction(1, 2)),
        (r"\frac{1}{2}", Fraction(1, 2)),
        (r"-\dfrac{3}{4}", Fraction(-3, 4)),
        (r"\frac12", Fraction(1, 2)),
        ("50%", Fraction(50)),
        ("1e3", Fraction(1000)),
        ("1/0", None),
        (r"\sqrt{2}", None),
        ("abc", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


# Pairs that both the plain fallback and math_verify must accept or reject.
NUMERIC_CASES = [
    ("1,000", "1000", True),
    ("0.5", "1/2", True),
    (r"\frac{1}{2}", "0.5", True),
    ("3.0", "3", True),
    ("-7", "-7.0", True),
    (r"-\frac{1}{2}", "-0.5", True),
    (r"\dfrac{3}{4}", "0.75", True),
    ("x = 5", "5", True),
    ("$18", "18", True),
    (r"\text{Yes}", "yes", True),
    ("72", "27", False),
    ("-7", "7", False),
    ("0.33", "1/3", False),
    (None, "3", False),
    ("", "3", False),
]


@pytest.mark.parametrize("pred, gold, expected", NUMERIC_CASES)
def test_answers_match_fallback(pred, gold, expected):
    assert answers_match(pred, gold, use_math_verify=False) is expected


@pytest.mark.skipif(not math_verify_available(), reason="math_verify not installed")
@pytest.mark.parametrize("pred, gold, expected", NUMERIC_CASES)
def test_answers_match_math_verify_agrees_on_numbers(pred, gold, expected):
    assert answers_match(pred, gold, use_math_verify=True) is expected


@pytest.mark.skipif(not math_verify_available(), reason="math_verify not installed")
@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        (r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2", True),
        (r"2\pi", r"\pi \cdot 2", True),
        (r"x^2 + 2x + 1", r"(x+1)^2", True),
        (r"\sqrt{3}", r"\sqrt{2}", False),
    ],
)
def test_answers_match_latex_with_math_verify(pred, gold, expected):
    assert answers_match(pred, gold) is expected


def test_latex_equivalence_needs_math_verify():
    """Without math_verify only normalized strings and numbers compare."""
    assert answers_match(r"\frac{\sqrt{2}}{2}", r"\sqrt{2}/2", use_math_verify=False) is False
    assert answers_match(r"\sqrt{2}", r"\sqrt{2}", use_math_verify=False) is True
