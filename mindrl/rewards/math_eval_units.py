"""Unit words that MindSpeed-RL's `acc` strips from a predicted answer.

The Qwen2.5-Math evaluation toolkit (mostly MathQA units) deletes each of these, and then
each with an `s` appended, wherever it stands as a separate word, in this order, twice;
a deletion that would leave nothing is skipped. The words are regular expressions as
written (`q .` matches `q` + any character), and include single letters (`a`, `t`, `s`,
`m`, ...): `\\frac{a}{b}` loses its `a`. Kept as data so the scores match.
"""

from __future__ import annotations

import re

UNIT_WORDS: tuple[str, ...] = (
    "east", "degree", "mph", "kmph", "ft", "m sqaure", " m east", "sq m", "deg", "mile",
    "q .", "monkey", "prime", "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb",
    "tile", "per", "dm", "lt", "gain", "ab", "way", "west", "a .", "b .", "c .", "d .",
    "e .", "f .", "g .", "h .", "t", "a", "h", "no change", "men", "soldier", "pie", "bc",
    "excess", "st", "inches", "noon", "percent", "by", "gal", "kmh", "c", "acre", "rise",
    "a . m", "th", "π r 2", "sq", "mark", "l", "toy", "coin", "sq . m", "gallon", "° f",
    "profit", "minw", "yr", "women", "feet", "am", "pm", "hr", "cu cm", "square",
    "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm", "number", "kmph",
    "day", "hour", "minute", "min", "second", "man", "woman", "sec", "cube", "mt",
    "sq inch", "mp", "∏ cm ³", "hectare", "more", "sec", "unit", "cu . m", "cm 2", "rs .",
    "rs", "kg", "g", "month", "km", "m", "cm", "mm", "apple", "liter", "loss", "yard",
    "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre", "pi sq m",
    "s .", "metre", "meter", "inch",
)  # fmt: skip

UNIT_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(r"(^|\W)" + word + r"($|\W)")
    for word in UNIT_WORDS + tuple(w + "s" for w in UNIT_WORDS)
)
