"""Last-`\\boxed{}` answer grading as MindSpeed-RL's `base_acc`, `math_17k_acc`, `acc_for_ppo`.

MindSpeed-RL grades these with the `mathruler` package, whose rules are OpenAI's PRM800K
grader: (a) the answers match after the Hendrycks MATH string normalisation, or (b) after a
second normalisation (units, LaTeX rendered as plain text) they are equal strings or sympy
simplifies their difference to 0, with two strictness rules: an integer ground truth needs
an integer answer, and two fractions must be written the same (unreduced ones do not match).
Written here from those rules, so `mathruler` and `pylatexenc` are not needed; the LaTeX to
text step (`latex_to_text`) covers what math answers use.
"""

from __future__ import annotations

import re

from mindrl.rewards.sympy_safe import safe_parse_expr

_BOX_OPEN = "\\boxed{"
_PRM_UNITS = (
    "degree cm centimeter meter mile second minute hour day week month year foot feet inch yard"
).split()
_UNIT_PATTERNS = [re.compile(rf"{unit}(es)?(s)? *(\^[0-9]+)?") for unit in _PRM_UNITS]
_TEXT_WRAPPED = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_GROUPED_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_TUPLE_CHARS = "()[]"


def last_boxed_content(text: str, strip: bool = True) -> str | None:
    """Content of the last `\\boxed{...}` (brace-matched, stripped unless `strip` is False);
    None if absent/open."""
    start = text.rfind(_BOX_OPEN)
    if start == -1:
        return None
    depth = 0
    body = text[start + len(_BOX_OPEN) :]
    for i, char in enumerate(body):
        depth += (char == "{") - (char == "}")
        if depth == -1:
            return body[:i].strip() if strip else body[:i]
    return None


# ---------------------------------------------------------------------------- Hendrycks MATH


def _fix_sqrt(text: str) -> str:
    head, *rest = text.split("\\sqrt")
    for piece in rest:  # an empty piece raises IndexError: the caller keeps the input
        head += "\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:])
    return head


def _fix_fracs(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`."""
    head, *rest = text.split("\\frac")
    for piece in rest:
        head += "\\frac"
        if piece[0] == "{":
            head += piece
        elif len(piece) < 2:
            return text
        elif piece[1] != "{":
            head += "{" + piece[0] + "}{" + piece[1] + "}" + piece[2:]
        else:
            head += "{" + piece[0] + "}" + piece[1:]
    return head


def _int_slash_int_as_frac(text: str) -> str:
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    return f"\\frac{{{a}}}{{{b}}}" if text == f"{a}/{b}" else text


def mathd_normalize(answer: str) -> str:
    """The Hendrycks MATH normalisation: a string form where trivially equal answers match."""
    answer = answer.strip()
    wrapped = _TEXT_WRAPPED.search(answer)
    if wrapped is not None:
        answer = wrapped.group("text").strip()
    try:
        return _mathd_strip(answer)
    except (IndexError, ValueError):
        return answer


def _mathd_strip(text: str) -> str:
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    for token in ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$"):
        text = text.replace(token, "")
    if "\\text{ " in text:  # a unit on the right
        parts = text.split("\\text{ ")
        if len(parts) != 2:
            raise ValueError("more than one unit")
        text = parts[0]
    text = text.replace("\\%", "").replace("%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    if "\\sqrt" in text:
        text = _fix_sqrt(text)
    text = _fix_fracs(text.replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _int_slash_int_as_frac(text)


# ---------------------------------------------------------------------------- PRM800K


def _is_int_value(value: float) -> bool:
    try:
        return abs(value - int(round(value))) <= 1e-7
    except (OverflowError, ValueError):
        return False


def _strip_grouping_commas(expr: str) -> str:
    while True:
        stripped = _GROUPED_COMMA.sub(r"\1\3\4", expr)
        if stripped == expr:
            return expr
        expr = stripped


def _str_is_int(text: str) -> bool:
    try:
        return _is_int_value(float(_strip_grouping_commas(text)))
    except ValueError:
        return False


def prm_normalize(expr: str) -> str:
    """PRM800K's normalisation: units, `$`, `%` and LaTeX gone, lower case, integers plain."""
    wrapped = _TEXT_WRAPPED.search(expr)
    if wrapped is not None:
        expr = wrapped.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in (("million", "6"), ("billion", "9"), ("trillion", "12")):
        expr = expr.replace(word, "*10^" + power)
    for pattern in _UNIT_PATTERNS:
        expr = pattern.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(",\\\\! *", "", expr)
    try:
        if _is_int_value(float(expr)):
            expr = str(int(round(float(expr))))
    except ValueError:
        pass
    if "\\" in expr:
        from mindrl.rewards.latex_text import latex_to_text

        try:
            expr = latex_to_text(expr)
        except Exception:  # malformed LaTeX stays as it is, like the original's
            pass
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", r"\1+\2", expr)  # mixed number: 7 3/4 -> 7+3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _may_evaluate(expr: str) -> bool:
    """PRM800K's guard: at most two unknown letters, no large or nested powers."""
    letters = {ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr:
        return False
    return not (re.search(r"\^[0-9]+\^", expr) or re.search(r"\^[0-9][0-9]+", expr))


def _equal_under_sympy(truth: str, given: str) -> bool:
    expr = f"({truth})-({given})"
    if not _may_evaluate(expr):
        return False
    try:
        import sympy

        difference = safe_parse_expr(expr.replace("^", "**"), implicit_multiplication=True)
        return bool(sympy.simplify(difference) == 0)
    except Exception:  # unparsable text is simply not equal
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_grouping_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (
        len(expr) > 2
        and expr[0] in _TUPLE_CHARS
        and expr[-1] in _TUPLE_CHARS
        and not any(ch in inner for ch in _TUPLE_CHARS)
    ):
        return [elem.strip() for elem in inner.split(",")]
    return [expr]


def grade_answer(given: str | None, truth: str) -> bool:
    """Whether `given` (an extracted answer) equals the ground truth `truth`."""
    if given is None:
        return False
    if mathd_normalize(truth) == mathd_normalize(given):
        return True
    truth_norm, given_norm = prm_normalize(truth), prm_normalize(given)
    if truth_norm == given_norm:
        return True
    if not given_norm:
        return False
    truth_elems, given_elems = _split_tuple(truth_norm), _split_tuple(given_norm)
    if len(truth_elems) > 1 and (
        truth_norm[0] != given_norm[0] or truth_norm[-1] != given_norm[-1]
    ):
        return False
    if len(truth_elems) != len(given_elems):
        return False
    for truth_elem, given_elem in zip(truth_elems, given_elems):
        if _FRACTION.search(truth_elem) and _FRACTION.search(given_elem):
            ok = truth_elem == given_elem  # unreduced fractions are not simplified
        elif _str_is_int(truth_elem) != _str_is_int(given_elem):
            ok = False  # an integer ground truth needs an integer answer
        else:
            ok = _equal_under_sympy(truth_elem, given_elem)
        if not ok:
            return False
    return True
