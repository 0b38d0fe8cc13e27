"""A small English + arithmetic corpus generated in code, for training the tiny test tokenizer.

Generated from a fixed seed so the tokenizer trained on it is the same on every machine; it
mixes prose, digits, arithmetic and the reasoning tags GRPO prompts use, so the BPE merges
cover the text the tests feed through the tiny models.
"""

from __future__ import annotations

import random

_NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy"]
_ITEMS = ["apples", "books", "coins", "pencils", "marbles", "cookies", "stamps", "cards"]
_GAIN_VERBS = ["buys", "finds", "collects", "wins"]
_LOSS_VERBS = ["sells", "gives away", "loses", "eats"]
_PLACES = ["the market", "school", "the park", "the library", "home", "the store"]
_PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "Reinforcement learning improves the policy with rewards from a verifier.",
    "The model reads the question, thinks step by step, and writes the answer.",
    "Every group of samples shares one prompt; advantages compare them.",
    "Small tests run quickly on a laptop without any network access.",
    "Please reason carefully and put the final answer inside the answer tags.",
    "What is the sum of the numbers below? Show your work.",
    "You are a helpful assistant.",
    "The weather today is sunny, with a light wind from the west.",
    "She counted the coins twice to be sure the total was right.",
    "If the train leaves at noon and travels for three hours, it arrives at three.",
]
_OPS = ["+", "-", "*"]


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 999), rng.randint(0, 99)
    op = rng.choice(_OPS)
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"{a} {op} {b} = {value}"


def _word_problem(rng: random.Random) -> tuple[str, str]:
    name, item, place = rng.choice(_NAMES), rng.choice(_ITEMS), rng.choice(_PLACES)
    start, more = rng.randint(20, 60), rng.randint(1, 19)
    gain = rng.random() < 0.5
    verb = rng.choice(_GAIN_VERBS if gain else _LOSS_VERBS)
    question = (
        f"{name} has {start} {item} at {place} and {verb} {more} of them. "
        f"How many {item} does {name} have now?"
    )
    total = start + more if gain else start - more
    reasoning = f"{name} starts with {start}. {start} {'+' if gain else '-'} {more}"
    return question, f"<think>{reasoning} = {total}.</think> <answer>{total}</answer>"


def tiny_corpus(n_lines: int = 400, seed: int = 1234) -> list[str]:
    """Return ``n_lines`` varied lines (prose, arithmetic, tagged answers); same for a seed."""
    rng = random.Random(seed)
    lines: list[str] = []
    step = 0
    while len(lines) < n_lines:
        kind, step = step % 5, step + 1
        if kind == 0:
            lines.append(rng.choice(_PROSE))
        elif kind == 1:
            lines.append(_arithmetic(rng))
        elif kind == 2:
            question, answer = _word_problem(rng)
            lines.append(question)
            lines.append(answer)
        elif kind == 3:
            nums = [str(rng.randint(0, 9999)) for _ in range(rng.randint(2, 6))]
            lines.append(f"Numbers: {', '.join(nums)}. Total: {sum(map(int, nums))}")
        else:
            expr = _arithmetic(rng)
            lines.append(f"<think>Compute {expr.split(' = ')[0]}.</think>")
            lines.append(f"<answer>{expr.split(' = ')[1]}</answer>")
    return lines[:n_lines]
