"""Final-answer extraction and normalisation of MindSpeed-RL's `acc` verifier.

MindSpeed-RL's `acc` reads answers with the rules of the Qwen2.5-Math evaluation toolkit
(its `extract_answer(text, "math")`), written here from those rules:

* extraction: Minerva's `final answer is $X$. I hope`, else the text after the last
  `boxed` (brace-matched when a `{` follows, else up to the next `$`), else after the last
  `he answer is` / `final answer is` / `答案是`, else the last number;
* normalisation (`normalize_prediction`): LaTeX spellings unified, a trailing `\\text{}`
  unit, unit words (`UNIT_WORDS`), `$`, `%` and `x=` removed, number words read as numbers,
  `2.0` -> `2`, `a/b` rewritten. Only the prediction is normalised; the label is compared
  as it is (so a `\\boxed{2}` or `#### 2` label never matches).

Two quirks of the original are kept so that scores match: `a/b` becomes a form feed +
`rac{a}{b}` (the original writes `"\\frac"` without escaping the backslash), so `\\boxed{1/2}`
does not match the label `1/2`; and a `\\frac` not followed by `{` leaves the answer
unnormalised.
"""

from __future__ import annotations

import re

from mindrl.rewards.number_words import words_to_number

_MINERVA_OPEN, _MINERVA_CLOSE = "final answer is $", "$. I hope"
_LAST_NUMBER = re.compile(r"-?\d*\.?\d+")
_TRAILING_TEXT = re.compile(r"\\text{.*?}$")
_FRAC_AS_WRITTEN = "\x0crac"  # what the original's "\frac" literal holds

# Unit words `acc` strips from a predicted answer. MindSpeed-RL's `acc` uses the Qwen2.5-Math
# evaluation toolkit's list (mostly MathQA units, odd entries included); mindrl does not copy
# that list. This is mindrl's own list of common units: a unit-bearing answer is graded the
# same whenever its unit is here, and may score differently from MindSpeed-RL for a rare unit
# (README, verifier notes). Each word, and the word with an `s` appended, is deleted where it
# stands as a separate word.
UNIT_WORDS: tuple[str, ...] = (
    "meter", "metre", "centimeter", "millimeter", "kilometer", "cm", "mm", "km", "m",
    "inch", "inches", "foot", "feet", "ft", "yard", "mile", "kilogram", "gram", "kg", "g",
    "lb", "pound", "liter", "litre", "gallon", "second", "sec", "minute", "min", "hour",
    "hr", "day", "week", "month", "year", "yr", "degree", "deg", "percent", "dollar",
    "cent", "rupee", "rs", "unit", "square", "sq", "cubic", "mph", "kmph", "kmh",
)  # fmt: skip

UNIT_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(r"(^|\W)" + word + r"($|\W)")
    for word in UNIT_WORDS + tuple(w + "s" for w in UNIT_WORDS)
)


def _braced_tail(tail: str) -> str:
    """Text up to the `}` closing the `{` at tail[0] (all of it when never closed)."""
    depth = 1
    for i, char in enumerate(tail[1:], start=1):
        depth += (char == "{") - (char == "}")
        if depth == 0:
            return tail[1:i]
    return tail[1:]


def _raw_answer(text: str) -> str | None:
    """The answer text before normalisation; None means "stop: the answer is empty"."""
    if _MINERVA_OPEN in text and _MINERVA_CLOSE in text:
        return text.split(_MINERVA_OPEN, 1)[1].split(_MINERVA_CLOSE, 1)[0].strip()
    if "boxed" in text:
        tail = text.split("boxed")[-1]
        if not tail:
            return None
        return _braced_tail(tail) if tail[0] == "{" else tail.split("$")[0].strip()
    for trigger in ("he answer is", "final answer is"):
        if trigger in text:
            return text.split(trigger)[-1].strip()
    if "答案是" in text:
        return text.split("答案是")[1].strip().split("\n\n")[0].strip()
    numbers = _LAST_NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else ""


def extract_final_answer(text: str) -> str:
    """The normalised final answer of `text` ("" when there is none)."""
    answer = _raw_answer(text.replace("\u043a\u0438", ""))
    if answer is None:
        return ""
    answer = re.sub(r"\n\s*", "", answer)
    if answer[:1] == ":":
        answer = answer[1:]
    if answer[-1:] == ".":
        answer = answer[:-1]
    if answer[-1:] == "/":
        answer = answer[:-1]
    try:
        return normalize_prediction(answer)
    except _Unnormalisable:
        return answer


class _Unnormalisable(Exception):
    """Raised where the original's normaliser fails; the answer then stays as extracted."""


def _fix_fracs(text: str) -> str:
    head, *rest = text.split("\\frac")
    for piece in rest:
        if not piece.startswith("{"):
            if len(piece) >= 2:
                return text
            raise _Unnormalisable(text)
        head += "\\frac" + piece
    return head


def _int_slash_int(text: str) -> str:
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        a = parts[0] if "sqrt" in parts[0] else int(parts[0])
        b = parts[1] if "sqrt" in parts[1] else int(parts[1])
    except ValueError:
        return text
    return f"{_FRAC_AS_WRITTEN}{{{a}}}{{{b}}}" if text == f"{a}/{b}" else text


def _drop_units(text: str) -> str:
    for _ in range(2):
        for pattern in UNIT_PATTERNS:
            stripped = pattern.sub(r"\1\2", text)
            if stripped:
                text = stripped
    return text


def normalize_prediction(text: str) -> str:
    """The toolkit's `strip_string` on a predicted answer (the unit-word pass included)."""
    text = str(text).strip().replace("\n", "").rstrip(".").replace("\\!", "")
    text = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", text)
    text = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", text).replace("bmatrix", "pmatrix")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    text = text.replace("\\left", "").replace("\\right", "")
    text = text.replace("\\{", "{").replace("\\}", "}")
    without_unit = _TRAILING_TEXT.sub("", text).strip()
    if without_unit and without_unit != text:
        text = without_unit
    text = _drop_units(text)
    for token in ("^{\\circ}", "^\\circ", "\\$", "$", "\\(", "\\)"):
        text = text.replace(token, "")
    text = words_to_number(text)
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    for key in ("x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to"):
        text = text.replace(key, "")
    text = text.replace("\\emptyset", "{}").replace("(-\\infty,\\infty)", "\\mathbb{R}")
    text = text.replace("\\%", "").replace("%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    text = text.replace("infinity", "\\infty")
    if "\\infty" not in text:
        text = text.replace("inf", "\\infty")
    text = text.replace("+\\inity", "\\infty").replace("and", "").replace("\\mathbf", "")
    text = re.sub(r"\\mbox{.*?}", "", text)
    if "j" in text and "i" not in text:
        text = text.replace("j", "i")
    text = re.sub(r"(\d+)\.0*([^\d])", r"\1\2", text)
    text = re.sub(r"(\d+)\.0*$", r"\1", text)
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", text).replace(" ", "")
    return _int_slash_int(_fix_fracs(text))
