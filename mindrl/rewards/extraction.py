"""Final-answer extraction and answer equivalence for math rewards.

Kept apart from the verifiers because data preprocessing uses the same functions to check
that every ground-truth label is gradable (`extract_label`) before training starts.

Extraction order of `extract_answer` (first that exists wins):
  1. the last `\\boxed{...}` / `\\fbox{...}` (nested braces handled);
  2. the last `<answer>...</answer>` block (its number if it holds a sentence);
  3. the last GSM8K `#### N` marker;
  4. the last number in the text.

Equivalence (`answers_match`): normalized strings, then exact rational comparison of numbers
(`1,000 == 1000`, `0.5 == 1/2 == \\frac{1}{2}`, `3.0 == 3`), then LaTeX equivalence through
`math_verify` when it is installed (`\\frac{\\sqrt{2}}{2} == \\sqrt{2}/2`).
"""

from __future__ import annotations

import functools
import re
import threading
from fractions import Fraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM8K = re.compile(r"####\s*([^\n]*)")
# A minus sign only when it is not a binary minus ("3-5" holds 3 and 5, not -5).
_NUMBER = re.compile(
    r"(?<![\w.)\]}])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|(?<![\w)\]}])-?\.\d+"
)
_DECIMAL = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_RATIO = re.compile(r"[-+]?\d+/\d+")
_GROUPED = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC = re.compile(r"(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}")
_FRAC_SHORT = re.compile(r"(-?)\\frac(\d)(\d)")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\{([^{}]*)\}")
_SIMPLE_LHS = re.compile(r"^[a-zA-Z]\w*=")
_WORD = re.compile(r"[a-zA-Z]{2,}")


# ---------------------------------------------------------------------------- extraction


def _braced_group(text: str, start: int) -> tuple[str, int] | None:
    """Content of the `{...}` opening at `start`, honouring nesting and `\\{`; None if open."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
        i += 1
    return None


def all_boxed(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` / `\\fbox{...}` (and `\\boxed 5`) in order."""
    found: list[tuple[int, str]] = []
    for command in _BOX_COMMANDS:
        pos = text.find(command)
        while pos != -1:
            j = pos + len(command)
            if j < len(text) and (text[j].isalpha()):  # e.g. \boxedx is another command
                pos = text.find(command, j)
                continue
            while j < len(text) and text[j] == " ":
                j += 1
            if j < len(text) and text[j] == "{":
                group = _braced_group(text, j)
                if group is not None:
                    found.append((pos, group[0]))
                    j = group[1]
            elif j > pos + len(command):  # "\boxed 5": one bare token
                token = re.match(r"[^\s$]+", text[j:])
                if token:
                    found.append((pos, token.group(0)))
            pos = text.find(command, j)
    return [content for _, content in sorted(found)]


def last_boxed(text: str) -> str | None:
    boxes = all_boxed(text)
    return boxes[-1].strip() if boxes else None


def answer_tag(text: str) -> str | None:
    """Content of the last complete `<answer>...</answer>` block."""
    blocks = _ANSWER_TAG.findall(text)
    return blocks[-1].strip() if blocks else None


def gsm8k_answer(text: str) -> str | None:
    """The value after the last `####` (GSM8K's final-answer marker)."""
    marks = _GSM8K.findall(text)
    if not marks:
        return None
    value = marks[-1].strip()
    number = _NUMBER.search(value)
    return number.group(0) if number else (value or None)


def last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _strip_math_delimiters(text: str) -> str:
    text = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            return text[len(left) : len(text) - len(right)].strip()
    return text


def _is_bare_answer(text: str) -> bool:
    """True when `text` reads as an answer rather than a sentence (no English words)."""
    without_commands = re.sub(r"\\[a-zA-Z]+", "", _TEXT_WRAP.sub("", text))
    return _WORD.search(without_commands) is None


def extract_answer(text: str) -> str | None:
    """The response's final answer as a string, or None when nothing is extractable."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    tagged = answer_tag(text)
    if tagged is not None:
        if "####" in tagged:
            return gsm8k_answer(tagged)
        tagged = _strip_math_delimiters(tagged)
        if tagged and _is_bare_answer(tagged):
            return tagged
        number = last_number(tagged)
        return number if number is not None else (tagged or None)
    marked = gsm8k_answer(text)
    if marked is not None:
        return marked
    return last_number(text)


def extract_label(label: str) -> str | None:
    """The gradable ground truth inside a dataset label, or None if it is empty.

    A label that is a full solution (GSM8K `... #### 72`, MATH `... \\boxed{72}`) is reduced
    to its answer; a plain answer is returned stripped. The last-number fallback is not
    used for labels: guessing would hide a broken data set.
    """
    label = str(label)
    boxed = last_boxed(label)
    if boxed is not None:
        return boxed or None
    if "####" in label:
        return gsm8k_answer(label)
    label = _strip_math_delimiters(label)
    return label or None


# ---------------------------------------------------------------------------- equivalence


def normalize_answer(text: str) -> str:
    """Canonical string form used for the string comparison and number parsing."""
    text = _strip_math_delimiters(text)
    for _ in range(3):  # nested wrappers such as \text{\textbf{5}}
        text = _TEXT_WRAP.sub(r"\1", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\$", "$"):
        text = text.replace(token, "")
    for token in ("^{\\circ}", "^\\circ", "\\%", "%", "\\degree"):
        text = text.replace(token, "")
    text = re.sub(r"\s+", "", text)
    if _SIMPLE_LHS.match(text):  # "x=5" -> "5"
        text = text.split("=", 1)[1]
    text = text.rstrip(".")
    return text


def parse_number(text: str) -> Fraction | None:
    """Exact value of a normalized numeric answer (int, decimal, ratio, \\frac), else None."""
    text = normalize_answer(text)
    if _GROUPED.fullmatch(text):
        text = text.replace(",", "")
    try:
        if _DECIMAL.fullmatch(text) or _RATIO.fullmatch(text):
            return Fraction(text)
        frac = _FRAC.fullmatch(text) or _FRAC_SHORT.fullmatch(text)
        if frac:
            value = Fraction(frac.group(2)) / Fraction(frac.group(3))
            return -value if frac.group(1) else value
    except (ValueError, ZeroDivisionError):
        return None
    return None


@functools.cache
def math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def warmup() -> None:
    """Import math_verify and build its parsers now, not inside a timed verifier call."""
    if math_verify_available():
        _math_verify_equal("\\frac{1}{2}", "0.5")
        # A number against a product of symbols reaches sympy's simplify, whose first call
        # imports sympy.physics (slow: paid here, not in the first sample's timeout).
        _math_verify_equal("1", "yes")


def _math_verify_equal(pred: str, gold: str) -> bool:
    from math_verify import parse, verify

    # math_verify's own timeouts use SIGALRM, which only the main thread may set; the
    # scorer's process pool bounds the time anyway.
    limit = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = parse(f"${_strip_math_delimiters(gold)}$", parsing_timeout=limit)
        pred_parsed = parse(f"${_strip_math_delimiters(pred)}$", parsing_timeout=limit)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=limit))
    except Exception:  # math_verify raises on pathological LaTeX: count it as a mismatch
        return False


def answers_match(pred: str | None, gold: str | None, use_math_verify: bool | None = None) -> bool:
    """Whether the extracted answer `pred` equals the ground truth `gold`.

    use_math_verify: None uses it when installed; False forces the plain fallback.
    """
    if pred is None or gold is None:
        return False
    norm_pred, norm_gold = normalize_answer(pred), normalize_answer(gold)
    if not norm_pred or not norm_gold:
        return False
    if norm_pred.lower() == norm_gold.lower():
        return True
    num_pred, num_gold = parse_number(norm_pred), parse_number(norm_gold)
    if num_pred is not None and num_gold is not None:
        return num_pred == num_gold
    if use_math_verify is None:
        use_math_verify = math_verify_available()
    return use_math_verify and _math_verify_equal(pred, gold)
