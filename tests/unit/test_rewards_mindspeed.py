"""MindSpeed-RL's verifier names score MindSpeed-RL's values, on MindSpeed-RL's own strings.

Inputs and expected values come from MindSpeed-RL's unit tests (tests/ut/models/
test_verifier.py, test_math_dapo.py, tests/ut/utils/test_grader.py) and from the probe
matrix of the MindSpeed-RL audit, measured by running MindSpeed-RL's own functions (HEAD
05a90d7). `lenient_acc` is mindrl's former `acc` and keeps its 1 / 0 values.
"""

import pytest

from mindrl.rewards.math_eval_equal import math_equal
from mindrl.rewards.minerva_answer import normalize_final_answer
from mindrl.rewards.registry import get_verifier, unsupported_verifier_reason, verifier_names
from mindrl.rewards.sympy_safe import safe_parse_expr
from mindrl.rewards.types import RewardParams, SampleMeta

NAMES = (
    "acc",
    "base_acc",
    "format",
    "strict_format",
    "step",
    "math_17k_acc",
    "acc_for_dapo",
    "acc_for_ppo",
    "math_verify_reward",
)


def score(name, response, label="", meta=None):
    return get_verifier(name)(response, label, meta)


def test_names_are_registered_and_retool_reward_is_no_longer_refused():
    assert set(NAMES) <= set(verifier_names())
    assert "retool_reward" in verifier_names()
    assert unsupported_verifier_reason("retool_reward") is None
    assert unsupported_verifier_reason("acc") is None
    assert unsupported_verifier_reason("no_such_name") is None


# ---------------------------------------------------------------------------- upstream tests

# tests/ut/models/test_verifier.py: the one response (8-space indents from its triple-quoted
# literal included) and label "34".
UT_TEXT = (
    "<think>\n"
    "First, we use the property of a parallelogram that opposite "
    "sides are equal in length. \n"
    "        Therefore, we have:\n"
    "\\[AB = CD \\quad \\text{and} \\quad BC = AD\\]\n"
    "\n"
    "From the given measurements:\n"
    "\\\n"
    "        [AB = 38 \\text{ cm}\\]\n"
    "\\[BC = 3y^3 \\text{ cm}\\]\n"
    "\\[CD = 2x + 4 \\text{ cm}\\]\n"
    "\\[AD = 24 \\text{ cm}\\]\n"
    "\n"
    "\n"
    "        Setting \\(AB = CD\\), we get:\n"
    "\\[38 = 2x + 4\\]\n"
    "\n"
    "Setting \\(BC = AD\\), we get:\n"
    "\\[3y^3 = 24\\]\n"
    "\n"
    "Now, \n"
    "        we solve each equation for \\(x\\) and \\(y\\).\n"
    "</think>\n"
    "<answer>\n"
    "First, solve for \\(x\\):\n"
    "\\[38 = 2x + 4\\]\n"
    "        \n"
    "\\[38 - 4 = 2x\\]\n"
    "\\[34 = 2x\\]\n"
    "\\[x = \\frac{34}{2} = 17\\]\n"
    "\n"
    "Next, solve for \\(y\\):\n"
    "\\[3y^3 = 24\\]\n"
    "\\\n"
    "        [y^3 = \\frac{24}{3} = 8\\]\n"
    "\\[y = \\sqrt[3]{8} = 2\\]\n"
    "\n"
    "Now, find the product of \\(x\\) and \\(y\\):\n"
    "\\[xy = \n"
    "        17 \\times 2 = 34\\]\n"
    "\n"
    "Therefore, the product of \\(x\\) and \\(y\\) is \\(\\boxed{34}\\).</answer>"
)


UT_EXPECTED = {
    # asserted by the upstream test
    "format": 1.0,
    "strict_format": 1.0,
    "step": 1.0,
    "base_acc": 1.0,
    "acc": 1.0,
    # measured with MindSpeed-RL's functions on the same input
    "math_17k_acc": 1.0,
    "acc_for_ppo": 1.0,
    "math_verify_reward": 1.0,
    "acc_for_dapo": -1.0,  # no "Answer:" line
}


@pytest.mark.parametrize("name", sorted(UT_EXPECTED))
def test_upstream_verifier_text(name):
    assert score(name, UT_TEXT, "34") == UT_EXPECTED[name]


# tests/ut/models/test_math_dapo.py: compute_score(strict_box_verify=False) is acc_for_dapo.
@pytest.mark.parametrize(
    "response, label, expected",
    [
        ("Some text \\boxed{2x + 3}", "2x + 3", -1.0),  # Minerva mode needs "Answer:"
        ("Some text \\boxed{2x + 4}", "2x + 3", -1.0),
        ("Some text " * 100 + "\\boxed{2x + 3}", "2x + 3", -1.0),
        # is_correct_minerva's cases: (False, "[INVALID]") twice, then (True, "2x+3")
        ("The answer is \\boxed{2x + 4}", "2x + 3", -1.0),
        ("No answer here", "2x + 3", -1.0),
        ("Answer: 2x + 3", "2x + 3", 1.0),
    ],
)
def test_upstream_dapo_scores(response, label, expected):
    assert score("acc_for_dapo", response, label) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: \\boxed{2x + 3}", "Answer:2x+3"),
        ("= \\boxed{2x + 3}", "2x+3"),
        ("an \\boxed{2x + 3}", "2x+3"),
        ("\\boxed{2x + 3} square", "2x+3"),
        ("$\\boxed{2x + 3}$", "2x+3"),
        ("\\text{Answer}: \\boxed{2x + 3}", "Answer:2x+3"),
        ("frac12", "frac{1}{2}"),
        ("sqrt2", "sqrt{2}"),
        ("1,000", "1000"),
    ],
)
def test_upstream_dapo_normalize_final_answer(text, expected):
    assert normalize_final_answer(text) == expected


# tests/ut/utils/test_grader.py: math_equal(prediction, reference), the equality of `acc`.
@pytest.mark.parametrize(
    "prediction, reference, expected",
    [
        ("x+1", "x+2n+1", False),
        ("x+1", "x+1", True),
        ("x+1", "x+2", False),
        ("1", "1.0", True),
        ("1", "1.0001", True),  # relative tolerance 1e-4
        ("1", "1.1", False),
    ],
)
def test_upstream_math_equal(prediction, reference, expected):
    assert math_equal(prediction, reference) is expected
    acc_value = 1.0 if expected else -0.5
    assert score("acc", f"so \\boxed{{{prediction}}}", reference) == acc_value


# ---------------------------------------------------------------------------- probe matrix

# (id, response, label, values in NAMES order), measured with MindSpeed-RL's functions.
PROBES = [
    (
        "r1_correct",
        "<think>reasoning</think><answer>The answer is \\boxed{2}</answer>",
        "2",
        (1.0, 1.0, 1.0, 1.0, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_wrong",
        "<think>reasoning</think><answer>The answer is \\boxed{3}</answer>",
        "2",
        (-0.5, 0.0, 1.0, 1.0, 0.0, 0.0, -1.0, 0.0, 0.0),
    ),
    (
        "r1_newlines",
        "<think>\nreasoning\n</think>\n<answer>\n\\boxed{2}\n</answer>",
        "2",
        (1.0, 1.0, 1.0, 1.0, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_no_box",
        "<think>reasoning</think><answer>2</answer>",
        "2",
        (-1.0, 0.0, 1.0, -0.5, 0.0, 0.0, -1.0, 0.0, 0.0),
    ),
    (
        "r1_text_between",
        "<think>reasoning</think>Some text<answer>\\boxed{2}</answer>",
        "2",
        (1.0, 1.0, 0.0, 1.0, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_trailing_text",
        "<think>reasoning</think><answer>\\boxed{2}</answer>\nextra words",
        "2",
        (1.0, 0.0, 1.0, -0.5, 0.0, 1.0, -1.0, 1.0, 0.0),
    ),
    (
        "r1_trailing_newline",
        "<think>reasoning</think><answer>\\boxed{2}</answer>\n",
        "2",
        (1.0, 0.0, 1.0, -0.5, 0.0, 1.0, -1.0, 1.0, 0.0),
    ),
    (
        "r1_leading_space",
        " <think>reasoning</think><answer>\\boxed{2}</answer>",
        "2",
        (1.0, 0.0, 0.0, -0.5, 0.0, 1.0, -1.0, 1.0, 0.0),
    ),
    (
        "r1_two_boxes",
        "<think>\\boxed{1}</think><answer>\\boxed{2}</answer>",
        "2",
        (1.0, 1.0, 1.0, -0.5, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_box_outside_answer",
        "<think>reasoning</think><answer>2</answer> \\boxed{2}",
        "2",
        (1.0, 0.0, 0.0, -0.5, 0.0, 1.0, -1.0, 1.0, 0.0),
    ),
    (
        "r1_frac_vs_decimal",
        "<think>r</think><answer>\\boxed{\\frac{1}{2}}</answer>",
        "0.5",
        (1.0, 1.0, 1.0, 1.0, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_frac_vs_frac",
        "<think>r</think><answer>\\boxed{\\frac{1}{2}}</answer>",
        "\\frac{1}{2}",
        (1.0, 1.0, 1.0, 1.0, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_dfrac",
        "<think>r</think><answer>\\boxed{\\dfrac{1}{2}}</answer>",
        "\\frac{1}{2}",
        (1.0, 1.0, 1.0, 1.0, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_thousands",
        "<think>r</think><answer>\\boxed{1,000}</answer>",
        "1000",
        (1.0, 1.0, 1.0, 1.0, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_int_vs_float",
        "<think>r</think><answer>\\boxed{2.0}</answer>",
        "2",
        (1.0, 1.0, 1.0, 1.0, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_label_boxed",
        "<think>r</think><answer>\\boxed{2}</answer>",
        "\\boxed{2}",
        (-0.5, 1.0, 1.0, 1.0, 0.0, 1.0, -1.0, 1.0, 1.0),
    ),
    (
        "r1_gsm8k_label",
        "<think>r</think><answer>\\boxed{72}</answer>",
        "Natalia sold 48/2 = 24 clips in May.\n#### 72",
        (-0.5, 0.0, 1.0, 1.0, 0.0, 0.0, -1.0, 0.0, 0.0),
    ),
    (
        "bare_boxed",
        "The answer is \\boxed{2}",
        "2",
        (1.0, 0.0, 0.0, -0.5, 0.0, 1.0, -1.0, 1.0, 0.0),
    ),
    (
        "bare_boxed_wrong",
        "The answer is \\boxed{3}",
        "2",
        (-0.5, 0.0, 0.0, -0.5, 0.0, 0.0, -1.0, 0.0, 0.0),
    ),
    ("plain_number", "The answer is 2", "2", (-1.0, 0.0, 0.0, -0.5, 0.0, 0.0, -1.0, 0.0, 0.0)),
    (
        "minerva_answer",
        "Let me compute.\nAnswer: 2",
        "2",
        (-1.0, 0.0, 0.0, -0.5, 0.0, 0.0, 1.0, 0.0, 0.0),
    ),
    (
        "minerva_answer_wrong",
        "Let me compute.\nAnswer: 3",
        "2",
        (-1.0, 0.0, 0.0, -0.5, 0.0, 0.0, -1.0, 0.0, 0.0),
    ),
    (
        "minerva_boxed",
        "Some text \\boxed{2x + 3}",
        "2x + 3",
        (1.0, 0.0, 0.0, -0.5, 0.0, 1.0, -1.0, 1.0, 0.0),
    ),
    (
        "minerva_answer_expr",
        "Answer: 2x + 3",
        "2x + 3",
        (-1.0, 0.0, 0.0, -0.5, 0.0, 0.0, 1.0, 0.0, 0.0),
    ),
    (
        "gsm8k_marker",
        "so 48+24 = 72\n#### 72",
        "72",
        (-1.0, 0.0, 0.0, -0.5, 0.0, 0.0, -1.0, 0.0, 0.0),
    ),
    (
        "im_end_stop",
        "<|im_start|>assistant\nso \\boxed{2}<|im_end|>\\boxed{3}",
        "2",
        (1.0, 0.0, 0.0, -0.5, 0.0, 0.0, -1.0, 0.0, 0.0),
    ),
    ("empty", "", "2", (-1.0, 0.0, 0.0, -0.5, 0.0, 0.0, -1.0, 0.0, 0.0)),
    (
        "steps3",
        "Step 1: a\nStep 2: b\nStep 3: c \\boxed{2}",
        "2",
        (1.0, 0.0, 0.0, -0.5, 1.0, 1.0, -1.0, 1.0, 0.0),
    ),
    (
        "steps_words",
        "First, add. Next, check. Finally, \\boxed{2}",
        "2",
        (1.0, 0.0, 0.0, -0.5, 1.0, 1.0, -1.0, 1.0, 0.0),
    ),
    (
        "loose_format_only",
        "<think>a</think>\n<answer>b</answer>",
        "2",
        (-1.0, 0.0, 1.0, -0.5, 0.0, 0.0, -1.0, 0.0, 0.0),
    ),
    (
        "format_multiline_trailing",
        "<think>a</think><answer>b</answer>\nmore text",
        "2",
        (-1.0, 0.0, 1.0, -0.5, 0.0, 0.0, -1.0, 0.0, 0.0),
    ),
]


@pytest.mark.parametrize("probe", PROBES, ids=[p[0] for p in PROBES])
def test_probe_matrix(probe):
    _, response, label, expected = probe
    got = tuple(score(name, response, label) for name in NAMES)
    assert dict(zip(NAMES, got)) == dict(zip(NAMES, expected))


# ---------------------------------------------------------------------------- edge rules


def test_acc_needs_a_boxed_answer():
    assert score("acc", "The answer is 2", "2") == -1.0  # right, but not boxed
    assert score("acc", "so \\boxed{2}", "2") == 1.0
    assert score("acc", "so \\boxed{3}", "2") == -0.5
    assert score("acc", "so \\boxed{}", "2") == -1.0  # nothing extracted
    # MindSpeed-RL writes a/b as a form feed + "rac{a}{b}": a boxed 1/2 never equals "1/2"
    assert score("acc", "so \\boxed{1/2}", "1/2") == -0.5
    assert score("acc", "so \\boxed{\\frac{1}{2}}", "0.5") == 1.0


def test_strict_format_without_the_box_rule():
    no_box = SampleMeta(params=RewardParams(strict_format_require_boxed=False))
    response = "<think>r</think> so <answer>42</answer>"
    assert score("strict_format", response) == -0.5
    assert score("strict_format", response, meta=no_box) == 1.0
    assert score("strict_format", response + "\n", meta=no_box) == -0.5


def test_model_output_is_never_run_as_python():
    # sympy's parser would eval these with Python's builtins; here they are plain symbols
    assert score("acc", "\\boxed{exit(3)}", "1") == -0.5
    assert score("math_17k_acc", "\\boxed{exit(3)}", "1") == 0.0
    with pytest.raises(ValueError, match="refused"):
        safe_parse_expr("().__class__")
    with pytest.raises(ValueError, match="refused"):
        safe_parse_expr("x.real")
    assert str(safe_parse_expr("eval(chr(111))")) == "eval(chr(111))"


# ---------------------------------------------------------------------------- lenient_acc


@pytest.mark.parametrize(
    "response, label, expected",
    [
        (r"so the answer is \boxed{\frac{1}{2}}", "0.5", 1.0),  # nested braces, LaTeX fraction
        (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", 1.0),
        (r"\boxed{\frac{3}{4}}", "3/5", 0.0),
        ("She pays 600 + 400 = 1000 dollars.\n#### 1,000", "1000", 1.0),  # GSM8K, commas
        ("The total is 1,000 apples", "1000", 1.0),
        ("The temperature drops to -7 degrees", "-7", 1.0),  # negative numbers
        ("The temperature drops to -7 degrees", "7", 0.0),
        ("<think>7 or 8?</think><answer>8</answer>", "8", 1.0),
        ("<think>7 or 8?</think><answer>The answer is 8.</answer>", "8.0", 1.0),
        ("I do not know.", "3", 0.0),  # no extractable answer
        ("", "3", 0.0),
        ("3", "Natalia sold 48 clips.\n#### 3", 1.0),  # a full GSM8K solution as label
        # mindrl's former `acc` values on the probe strings where MindSpeed-RL's acc differs
        ("<think>reasoning</think><answer>2</answer>", "2", 1.0),
        ("<think>r</think><answer>\\boxed{2}</answer>", "\\boxed{2}", 1.0),
        (
            "<think>r</think><answer>\\boxed{72}</answer>",
            "Natalia sold 48/2 = 24 clips in May.\n#### 72",
            1.0,
        ),
        ("The answer is 2", "2", 1.0),
        ("Let me compute.\nAnswer: 2", "2", 1.0),
        ("so 48+24 = 72\n#### 72", "72", 1.0),
        ("The answer is \\boxed{3}", "2", 0.0),
        ("<|im_start|>assistant\nso \\boxed{2}<|im_end|>\\boxed{3}", "2", 0.0),
    ],
)
def test_lenient_acc_keeps_the_former_acc_values(response, label, expected):
    assert score("lenient_acc", response, label) == expected
    assert get_verifier("accuracy") is get_verifier("lenient_acc")
