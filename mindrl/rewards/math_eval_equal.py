"""Answer equality of MindSpeed-RL's `acc` verifier (the Qwen2.5-Math toolkit's rules).

`math_equal(prediction, reference)`, in order: equal ignoring case; a choice letter A-E;
both numbers (commas dropped, `50%` read as 0.5) equal within a relative 1e-4 of the
reference, the reference / 100 or the reference x 100 (and if both are numbers, nothing
else is tried); equal once brackets are dropped; tuples and matrices element by element;
`x = 5` against `5`, and equations against equations; else symbolic equality through sympy.
Expressions are parsed as sympy input (`safe_parse_expr`, never eval'd with builtins) or as
LaTeX (`latex2sympy2_extended`, which math-verify already installs).
"""

from __future__ import annotations

import math
import re
from typing import Any

from mindrl.rewards.sympy_safe import safe_parse_expr

_CHOICES = ("A", "B", "C", "D", "E")
_CHOICE = re.compile(r"\b(A|B|C|D|E)\b")
_BRACKETED = re.compile(r"(\(|\[).+(\)|\])")
_UNREAD_LATEX = re.compile(r"boxed|\\text|\\mathrm|\\mbox|\\in(?![a-zA-Z])")
_DIGIT_FRAC = re.compile(r"(\d)\s*(\\[dt]?frac)")
_PMATRIX_OPEN, _PMATRIX_CLOSE = "\\begin{pmatrix}", "\\end{pmatrix}"


def _clean_choice(pred: str) -> str:
    pred = pred.strip("\n").rstrip(".").rstrip("/").strip(" ").lstrip(":")
    letters = _CHOICE.findall(pred.upper())
    pred = letters[-1] if letters else pred.strip().strip(".")
    return pred.rstrip(".").rstrip("/")


def parse_digits(text: str) -> float | None:
    """A number with its commas dropped; `50%` / `50\\%` as 0.5; None if not a number."""
    text = str(text).replace(",", "")
    try:
        return float(text)
    except ValueError:
        if not text.endswith("%"):
            return None
        text = text[:-1].removesuffix("\\")
        try:
            return float(text) / 100
        except ValueError:
            return None


def numeric_equal(prediction: float, reference: float) -> bool:
    return math.isclose(reference, prediction, rel_tol=1e-4)


def _pmatrix_of(text: str) -> str:
    """`{1,2}` groups as `\\begin{pmatrix}1\\2\\end{pmatrix}` (for a matrix prediction)."""
    rows = re.findall(r"\{.*,.*\}", text.strip())
    return ", ".join(
        _PMATRIX_OPEN + m.strip("{}").replace(",", "\\") + _PMATRIX_CLOSE for m in rows
    )


def _is_pmatrix(text: str) -> bool:
    return text.startswith(("\\begin{pmatrix}", "\\begin{bmatrix}")) and text.endswith(
        ("\\end{pmatrix}", "\\end{bmatrix}")
    )


def _matrix_rows(text: str) -> list[str]:
    body = text[len(_PMATRIX_OPEN) : -len(_PMATRIX_CLOSE)]
    return [line.strip() for line in body.split("\\\\") if line.strip()]


def _matrices_equal(prediction: str, reference: str) -> bool:
    pred_rows, ref_rows = _matrix_rows(prediction), _matrix_rows(reference)
    if len(pred_rows) != len(ref_rows):
        return False
    for pred_row, ref_row in zip(pred_rows, ref_rows):
        pred_cells, ref_cells = pred_row.split("&"), ref_row.split("&")
        if len(pred_cells) != len(ref_cells):
            return False
        if not all(math_equal(p, r) for p, r in zip(pred_cells, ref_cells)):
            return False
    return True


def math_equal(prediction: str, reference: str) -> bool:
    """Whether the normalised prediction equals the reference (label as given)."""
    if prediction.strip().lower() == reference.strip().lower():
        return True
    if reference in _CHOICES and _clean_choice(prediction) == reference:
        return True
    pred_num, ref_num = parse_digits(prediction), parse_digits(reference)
    if pred_num is not None and ref_num is not None:
        return any(
            numeric_equal(pred_num, item) for item in (ref_num / 100, ref_num, ref_num * 100)
        )
    if not prediction:
        return False
    reference, prediction = str(reference).strip(), str(prediction).strip()
    if "pmatrix" in prediction and "pmatrix" not in reference:
        reference = _pmatrix_of(reference)
    pred_str, ref_str = prediction, reference
    if (
        prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")
    ) or (
        prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
    ):
        pred_str, ref_str = pred_str.strip("[]()"), ref_str.strip("[]()")
    for bracket in "{}()":
        pred_str, ref_str = pred_str.replace(bracket, ""), ref_str.replace(bracket, "")
    if pred_str.lower() == ref_str.lower():
        return True
    if _BRACKETED.match(prediction) and _BRACKETED.match(reference):
        pred_parts, ref_parts = prediction[1:-1].split(","), reference[1:-1].split(",")
        if len(pred_parts) == len(ref_parts) and all(
            math_equal(p, r) for p, r in zip(pred_parts, ref_parts)
        ):
            return True
    if _is_pmatrix(prediction) and _is_pmatrix(reference):
        if _matrices_equal(prediction, reference):
            return True
    if prediction.count("=") == 1 and reference.count("=") == 1:
        pred_lhs, pred_rhs = (side.strip() for side in prediction.split("="))
        ref_lhs, ref_rhs = (side.strip() for side in reference.split("="))
        pred_diff, ref_diff = f"{pred_lhs} - ({pred_rhs})", f"{ref_lhs} - ({ref_rhs})"
        if symbolic_equal(pred_diff, ref_diff) or symbolic_equal(f"-({pred_diff})", ref_diff):
            return True
    elif prediction.count("=") == 1 and len(prediction.split("=")[0].strip()) <= 2:
        if "=" not in reference and math_equal(prediction.split("=")[1], reference):
            return True
    elif reference.count("=") == 1 and len(reference.split("=")[0].strip()) <= 2:
        if "=" not in prediction and math_equal(prediction, reference.split("=")[1]):
            return True
    return symbolic_equal(prediction, reference)


# ---------------------------------------------------------------------------- symbolic


def _parse_latex(text: str) -> Any:
    from latex2sympy2_extended import latex2sympy
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig
    from latex2sympy2_extended.math_normalization import NormalizationConfig

    # Read as MindSpeed-RL's latex2sympy2 reads LaTeX: it has no \boxed; `\text{No x}` and
    # `\mathrm{A}` are opaque symbols, equal only to the same spelling (kept as text here);
    # no input rewriting, case kept, `x \in S` is not an equation, and `1\frac{1}{2}` is
    # 1 x 1/2 (latex2sympy2_extended alone would read the mixed number 3/2).
    if _UNREAD_LATEX.search(text):
        raise ValueError("not read by MindSpeed-RL's LaTeX parser")
    plain = NormalizationConfig(
        basic_latex=False, units=False, malformed_operators=False, nits=False, boxed="none"
    )
    literal = ConversionConfig(interpret_contains_as_eq=False, lowercase_symbols=False)
    text = _DIGIT_FRAC.sub(r"\1 \\cdot \2", text)
    return latex2sympy(text, normalization_config=plain, conversion_config=literal)


def _parse(text: str) -> Any:
    """sympy input first, then LaTeX; the text itself when neither reads it."""
    for parser in (safe_parse_expr, _parse_latex):
        for candidate in (text.replace("\\\\", "\\"), text):
            try:
                return parser(candidate)
            except Exception:  # noqa: S112  (the next parser / spelling is tried)
                continue
    return text


def symbolic_equal(a_text: str, b_text: str) -> bool:
    """Equal as sympy objects: same form, zero difference, same equation, same value."""
    import sympy

    a, b = _parse(a_text), _parse(b_text)
    try:
        if str(a) == str(b) or a == b:
            return True
    except Exception:  # noqa: S110  (comparing odd objects may raise: not equal)
        pass
    if isinstance(a, str) or isinstance(b, str):
        return False  # unparsed text: only the string comparison above applies
    checks = (
        lambda: a.equals(b) or sympy.simplify(a - b) == 0,
        lambda: abs(a.lhs - a.rhs).equals(abs(b.lhs - b.rhs)),
        lambda: numeric_equal(float(sympy.N(a)), float(sympy.N(b))),
        lambda: (
            a.shape == b.shape
            and a.applyfunc(lambda x: round(x, 3)).equals(b.applyfunc(lambda x: round(x, 3)))
        ),
    )
    for check in checks:
        try:
            if check():
                return True
        except Exception:  # noqa: S112  (a check that does not apply raises)
            continue
    return False
