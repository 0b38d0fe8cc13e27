"""Ground-truth extraction used at preprocessing time."""

from __future__ import annotations

import pytest

from mindrl.data.answers import (
    extract_gsm8k_answer,
    extract_label,
    extract_last_boxed,
    label_to_text,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She sold 48 + 24 = 72 clips.\n#### 72", "72"),
        ("... #### 1,234", "1234"),
        ("#### -5", "-5"),
        ("#### 3.5", "3.5"),
        ("no marker here 72", None),
        ("#### ", None),
    ],
)
def test_gsm8k(text, expected):
    assert extract_gsm8k_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\fbox{7}", "7"),
        ("\\boxed{}", None),
        ("\\boxed{unclosed", None),
        ("plain", None),
    ],
)
def test_boxed(text, expected):
    assert extract_last_boxed(text) == expected


def test_label_formats():
    assert extract_label(" 12 ", "raw") == "12"
    assert extract_label("", "raw") is None
    assert extract_label("x #### 9", "auto") == "9"
    assert extract_label("answer \\boxed{x+1}", "auto") == "x+1"
    assert extract_label("\\frac{3}{4}", "auto") == "\\frac{3}{4}"
    assert extract_label("1,000", "numeric") == "1000"
    assert extract_label("ten", "numeric") is None
    with pytest.raises(ValueError):
        extract_label("1", "nope")


def test_label_to_text():
    assert label_to_text(3) == "3"
    assert label_to_text(3.0) == "3"
    assert label_to_text(0.25) == "0.25"
    assert label_to_text("x") == "x"
    assert label_to_text(True) is None
    assert label_to_text(float("nan")) is None
    assert label_to_text([1]) is None
