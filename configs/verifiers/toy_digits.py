"""A toy reward a randomly initialised tiny model can learn in a few dozen GRPO steps.

The tiny model starts with near-uniform next-token probabilities over 448 ids, ~2% of them
digits. `digit_share` scores the share of the response's characters that are digits, so the
signal is dense from step one and GRPO's group-relative advantages pull the policy towards
answering with numbers. Loaded through `rl_config.verifier_files` (a custom verifier file).
"""

from mindrl.rewards.registry import register_verifier


@register_verifier("digit_share")
def digit_share(response: str, label: str, meta=None) -> float:
    text = "".join(response.split())
    if not text:
        return 0.0
    return sum(ch.isdigit() for ch in text) / len(text)
