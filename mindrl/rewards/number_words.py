"""English number words to digits, as MindSpeed-RL's `acc` normaliser reads them.

Follows the rules of the `word2number` package the Qwen2.5-Math toolkit calls, so that
`word2number` is not needed: the number words of the text are picked out and every other
word is ignored (`"two apples"` -> `2`), one `point` starts decimal digits, and anything the
package refuses (no number word, a repeated scale word, scales out of order) leaves the text
unchanged. A digit string is read as an integer (`"007"` -> `7`).
"""

from __future__ import annotations

_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
VALUES: dict[str, int] = {
    **{word: i for i, word in enumerate(_UNITS)},
    **{word: 20 + 10 * i for i, word in enumerate(_TENS)},
    "hundred": 100,
    "thousand": 1000,
    "million": 1_000_000,
    "billion": 1_000_000_000,
}
_SCALES = ("billion", "million", "thousand")


def _group_value(words: list[str]) -> int:
    """word2number's value of the words before a scale word (its four-word formula)."""
    values = [VALUES[word] for word in words]  # KeyError for "point": refused
    if len(values) == 4:
        return values[0] * values[1] + values[2] + values[3]
    if len(values) == 3:
        return values[0] * values[1] + values[2]
    if len(values) == 2:
        return values[0] * values[1] if 100 in values else values[0] + values[1]
    return values[0]  # IndexError for none: refused


def _to_number(sentence: str) -> int | float:
    sentence = sentence.replace("-", " ").lower()
    if sentence.isdigit():
        return int(sentence)
    words = [w for w in sentence.split() if w in VALUES or w == "point"]
    if not words:
        raise ValueError("no number words")
    if any(words.count(w) > 1 for w in (*_SCALES, "point")):
        raise ValueError("repeated scale word")
    decimals: list[str] = []
    if "point" in words:
        at = words.index("point")
        words, decimals = words[:at], words[at + 1 :]
    scale_at = {scale: words.index(scale) if scale in words else -1 for scale in _SCALES}
    bil, mil, tho = scale_at["billion"], scale_at["million"], scale_at["thousand"]
    if (tho > -1 and (tho < mil or tho < bil)) or (mil > -1 and mil < bil):
        raise ValueError("scales out of order")
    total: int | float = 0
    if len(words) == 1:
        total = VALUES[words[0]]
    elif words:
        if bil > -1:
            total += _group_value(words[:bil]) * 1_000_000_000
        if mil > -1:
            total += _group_value(words[bil + 1 : mil]) * 1_000_000
        if tho > -1:
            total += _group_value(words[max(bil, mil) + 1 : tho]) * 1000
        # The words after a scale count once more: the first scale (thousand, million,
        # billion) that is not the last word takes all that follows it, as in word2number.
        last = len(words) - 1
        rest = next((i for i in (tho, mil, bil) if -1 < i != last), None)
        if rest is not None:
            total += _group_value(words[rest + 1 :])
        elif max(bil, mil, tho) == -1:
            total += _group_value(words)
    if decimals:
        if all(w in _UNITS[:10] for w in decimals):
            total += float("0." + "".join(str(VALUES[w]) for w in decimals))
    return total


def words_to_number(text: str) -> str:
    """`text` with its number words read as one number, or unchanged when there are none."""
    try:
        return str(_to_number(text))
    except (ValueError, KeyError, IndexError, TypeError):
        return text
