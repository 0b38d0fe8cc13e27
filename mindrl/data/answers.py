"""Ground-truth extraction at preprocessing time.

A row whose answer cannot be extracted never reaches the store, so the reward code never
sees an empty label. These helpers are deliberately local to the data package: the
reward-side extraction (model outputs) has other needs (lenient parsing of free text).
"""

from __future__ import annotations

import re
from typing import Any

_GSM8K_RE = re.compile(r"####\s*(-?[0-9.,]+)")
_NUMBER_RE = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")
LABEL_FORMATS = ("auto", "raw", "gsm8k", "boxed", "numeric")


def extract_gsm8k_answer(text: str) -> str | None:
    """The number after ``#### `` (GSM8K's convention), thousands separators removed."""
    match = _GSM8K_RE.search(text)
    if match is None:
        return None
    value = match.group(1).replace(",", "").rstrip(".")
    return value if value and value not in {"-", "."} else None


def extract_last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                content = text[i:j].strip()
                return content or None
    return None


def is_number(text: str) -> bool:
    """True for plain decimal numbers (``-3``, ``0.5``, ``1e3``; commas allowed as separators)."""
    return bool(_NUMBER_RE.match(text.replace(",", "").strip()))


def label_to_text(value: Any) -> str | None:
    """A label value as text; numbers print without a spurious ``.0``; others -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value
    return None


def extract_label(text: str, label_format: str = "auto") -> str | None:
    """The ground truth from an answer field, or None when there is none to extract.

    - ``raw``: the stripped text as is;
    - ``gsm8k``: the number after ``####``;
    - ``boxed``: the content of the last ``\\boxed{}``;
    - ``numeric``: the text must be a number (commas removed);
    - ``auto``: ``####`` if present, else the last ``\\boxed{}`` if present, else raw.
    """
    if label_format not in LABEL_FORMATS:
        raise ValueError(f"label_format must be one of {LABEL_FORMATS}, got {label_format!r}")
    text = text.strip()
    if label_format == "gsm8k":
        return extract_gsm8k_answer(text)
    if label_format == "boxed":
        return extract_last_boxed(text)
    if label_format == "numeric":
        return text.replace(",", "") if is_number(text) else None
    if label_format == "auto":
        if "####" in text:
            return extract_gsm8k_answer(text)
        if "\\boxed{" in text or "\\fbox{" in text:
            return extract_last_boxed(text)
    return text or None
