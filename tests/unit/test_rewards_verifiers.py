"""Built-in verifiers against hand-written responses and formulas written out here.

MindSpeed-RL's names against MindSpeed-RL's own strings and values: test_rewards_mindspeed.py
(which also holds `lenient_acc`, the former `acc`)."""

import math

import pytest

from mindrl.rewards.registry import get_verifier, verifier_names
from mindrl.rewards.types import RewardParams, SampleMeta

BUILTINS = [
    "acc",
    "lenient_acc",
    "accuracy",
    "base_acc",
    "format",
    "strict_format",
    "cosine",
    "repetition",
    "soft_overlong",
]


def score(name, response, label="", meta=None):
    return get_verifier(name)(response, label, meta)


def test_builtins_are_registered():
    assert set(BUILTINS) <= set(verifier_names())
    assert get_verifier("accuracy") is get_verifier("lenient_acc")


# ---------------------------------------------------------------------------- base_acc

R1_OK = "<think>2+2 is 4</think> <answer>The answer is \\boxed{4}</answer>"


@pytest.mark.parametrize(
    "response, label, expected",
    [
        (R1_OK, "4", 1.0),
        (R1_OK, "5", 0.0),
        ("<think>2+2</think><answer>4</answer>", "4", 0.0),  # no boxed answer
        (r"The answer is \boxed{4}", "4", 0.0),  # boxed but no R1 layout
        (r"<think>\boxed{4}</think><answer>four</answer>", "4", 0.0),  # boxed outside answer
        (R1_OK + " and more text", "4", 0.0),  # something after </answer>
        (r"<think>a</think><answer>\boxed{\frac{1}{2}}</answer>", "0.5", 1.0),
    ],
)
def test_base_acc(response, label, expected):
    assert score("base_acc", response, label) == expected


def test_lenient_acc_ignores_layout_where_base_acc_does_not():
    assert score("lenient_acc", r"The answer is \boxed{4}", "4") == 1.0
    assert score("base_acc", r"The answer is \boxed{4}", "4") == 0.0


# ---------------------------------------------------------------------------- format

NO_BOX = RewardParams(strict_format_require_boxed=False)


@pytest.mark.parametrize(
    "response, loose, strict, strict_no_box",
    [
        ("<think>r</think><answer>\\boxed{42}</answer>", 1.0, 1.0, 1.0),
        ("<think>r</think>\n\n<answer>\\boxed{42}</answer>", 1.0, 1.0, 1.0),
        ("<think>r</think><answer>42</answer>", 1.0, -0.5, 1.0),  # no boxed
        ("<think>r</think><answer>\\boxed{42}</answer>\n", 1.0, -0.5, -0.5),  # trailing
        ("<think>r</think><answer>\\boxed{42}</answer> P.S.", 0.0, -0.5, -0.5),
        ("Sure. <think>r</think><answer>\\boxed{42}</answer>", 0.0, -0.5, -0.5),
        ("<think>a</think><think>b</think><answer>\\boxed{1}</answer>", 1.0, -0.5, -0.5),
        ("<think>r</think> so <answer>\\boxed{1}</answer>", 0.0, 1.0, 1.0),  # text between
        ("<answer>\\boxed{1}</answer><think>r</think>", 0.0, -0.5, -0.5),
        ("<think>\\boxed{1}</think><answer>\\boxed{1}</answer>", 1.0, -0.5, 1.0),  # two boxes
        ("<think>r</think><answer>\\boxed{1}", 0.0, -0.5, -0.5),  # truncated
        ("just an answer: 42", 0.0, -0.5, -0.5),
    ],
)
def test_format_variants(response, loose, strict, strict_no_box):
    assert score("format", response) == loose
    assert score("strict_format", response) == strict
    assert score("strict_format", response, meta=SampleMeta(params=NO_BOX)) == strict_no_box


# ---------------------------------------------------------------------------- cosine


def cosine_formula(length, max_len, at_zero, at_max):
    """Half cosine from at_zero (length 0) to at_max (length max_len), clamped beyond."""
    t = min(length, max_len)
    return at_max + 0.5 * (at_zero - at_max) * (1 + math.cos(math.pi * t / max_len))


@pytest.mark.parametrize("length", [0, 250, 500, 1000, 1500])
def test_cosine_defaults(length):
    meta = SampleMeta(response_length=length, max_length=1000)
    right = score("cosine", r"\boxed{3}", "3", meta)
    wrong = score("cosine", r"\boxed{4}", "3", meta)
    # ms-swift defaults: correct 1.0 -> 0.5, wrong -0.5 -> 0.0 as the length grows
    assert right == pytest.approx(cosine_formula(length, 1000, 1.0, 0.5))
    assert wrong == pytest.approx(cosine_formula(length, 1000, -0.5, 0.0))


def test_cosine_end_points_and_params():
    params = RewardParams(
        cosine_min_len_value_wrong=-1.0,
        cosine_max_len_value_wrong=-0.2,
        cosine_min_len_value_correct=2.0,
        cosine_max_len_value_correct=1.0,
        cosine_max_len=100,  # overrides meta.max_length
    )

    def at(length, response):
        meta = SampleMeta(response_length=length, max_length=5000, params=params)
        return score("cosine", response, "3", meta)

    assert at(0, r"\boxed{3}") == pytest.approx(2.0)
    assert at(100, r"\boxed{3}") == pytest.approx(1.0)
    assert at(50, r"\boxed{3}") == pytest.approx(1.5)
    assert at(0, "no") == pytest.approx(-1.0)
    assert at(100, "no") == pytest.approx(-0.2)
    assert at(400, "no") == pytest.approx(-0.2)  # clamped beyond max_len


def test_cosine_needs_a_length():
    with pytest.raises(ValueError, match="response_length"):
        score("cosine", r"\boxed{3}", "3", SampleMeta(max_length=10))
    with pytest.raises(ValueError, match="max_length"):
        score("cosine", r"\boxed{3}", "3", SampleMeta(response_length=10))


# ---------------------------------------------------------------------------- repetition


def test_repetition_known_string():
    text = "a b c a b c a b c"  # 9 words -> 7 trigrams, 3 distinct
    assert score("repetition", text) == pytest.approx((1 - 3 / 7) * -1.0)


def test_repetition_case_params_and_edges():
    text = "A b c a B c"  # lower-cased: 4 trigrams, 3 distinct
    assert score("repetition", text) == pytest.approx(-(1 - 3 / 4))
    params = RewardParams(repetition_n_grams=2, repetition_max_penalty=-2.0)
    # bigrams of "x y x y x": (x y) (y x) (x y) (y x) -> 2 distinct of 4
    meta = SampleMeta(params=params)
    assert score("repetition", "x y x y x", meta=meta) == pytest.approx(-2.0 * (1 - 2 / 4))
    assert score("repetition", "all words are different here") == 0.0
    assert score("repetition", "too short") == 0.0
    assert score("repetition", "") == 0.0


# ---------------------------------------------------------------------------- soft_overlong


@pytest.mark.parametrize(
    "length, expected",
    [
        (10, 0.0),  # well inside
        (80, 0.0),  # at the start of the buffer: L_max - L_cache
        (81, (80 - 81) / 20),
        (90, (80 - 90) / 20),  # inside the buffer: linear
        (100, -1.0),  # at L_max
        (150, -1.0),  # beyond
    ],
)
def test_soft_overlong(length, expected):
    params = RewardParams(soft_max_length=100, soft_cache_length=20)
    meta = SampleMeta(response_length=length, max_length=4096, params=params)
    assert score("soft_overlong", "text", meta=meta) == pytest.approx(expected)


def test_soft_overlong_max_length_from_meta():
    params = RewardParams(soft_cache_length=10)
    meta = SampleMeta(response_length=45, max_length=50, params=params)
    assert score("soft_overlong", "text", meta=meta) == pytest.approx((40 - 45) / 10)
    with pytest.raises(ValueError, match="soft_cache_length"):
        score("soft_overlong", "t", meta=SampleMeta(response_length=5, max_length=50))


def test_params_validation():
    with pytest.raises(ValueError):
        RewardParams(soft_max_length=10, soft_cache_length=20)
    with pytest.raises(ValueError):
        RewardParams(repetition_max_penalty=0.5)
    with pytest.raises(ValueError):
        RewardParams(repetition_n_grams=0)
    with pytest.raises(ValueError):
        RewardParams(cosine_max_len=0)
