"""Unit words `acc` strips from a predicted answer before comparing it with the label.

MindSpeed-RL's `acc` uses the Qwen2.5-Math evaluation toolkit's list (mostly MathQA units,
odd entries included); mindrl does not copy that list. This is mindrl's own list of common
units: a unit-bearing answer is graded the same whenever its unit is here, and may score
differently from MindSpeed-RL for a rare unit (README, verifier notes). Each word, and the
word with an `s` appended, is deleted where it stands as a separate word.
"""

from __future__ import annotations

import re

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
