"""The `Answer: X` grading of DAPO, MindSpeed-RL's `acc_for_dapo`.

Minerva's rule as DAPO's recipe uses it: only the last 300 characters count; the answer is
the text after the last `Answer:` line marker (case-insensitive); answer and label are
normalised (text after the last `=`, units and filler words, `\\text{}` / `\\boxed{}` / `$`
removed, `\\fracab` -> `\\frac{a}{b}`, `1,000` -> `1000`) and must then be the same string.
A response that only boxes its answer has no `Answer:` line and scores -1, as in
MindSpeed-RL (its own unit test asserts it).
"""

from __future__ import annotations

import re

_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_TAIL_CHARS = 300
NO_ANSWER = "[INVALID]"

# (old, new) in order, then removed words and macros, as Minerva's normaliser applies them.
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square ways integers dollars mph inches hours km units \\ldots sue points feet minutes "
    "digits cents degrees cm gm pounds meters meals edges students childrentickets multiples"
).split() + [
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
]
_UNWRAP = [
    re.compile(r"(\\text\{)(.*?)(\})"),
    re.compile(r"(\\textbf\{)(.*?)(\})"),
    re.compile(r"(\\overline\{)(.*?)(\})"),
    re.compile(r"(\\boxed\{)(.*)(\})"),
]


def normalize_final_answer(answer: str) -> str:
    """Minerva's canonical string form of a final answer."""
    answer = answer.split("=")[-1]
    for old, new in _SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for word in _REMOVED:
        answer = answer.replace(word, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)  # keep the first $...$
    for pattern in _UNWRAP:
        answer = pattern.sub("\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def minerva_answer(response: str) -> str:
    """The normalised `Answer:` value in the last 300 characters, or `[INVALID]`."""
    found = _ANSWER_LINE.findall(response[-_TAIL_CHARS:])
    return normalize_final_answer(found[-1] if found else NO_ANSWER)


def minerva_score(response: str, label: str) -> float:
    """1.0 when the response's `Answer:` equals the label after normalisation, else -1.0."""
    return 1.0 if minerva_answer(response) == normalize_final_answer(label) else -1.0
