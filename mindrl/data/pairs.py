"""Reading a pairwise store (`cli/preprocess_data.py` with AlpacaStylePairwiseHandler) into
typed pairs, and padding a batch of them into the [2B, T] grid a DPO step scores: the B
chosen sequences first, then the B rejected ones, with 0/1 masks on the answer tokens."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mindrl.data.store import StoreError, iter_prompts, read_meta


@dataclass(frozen=True)
class PreferencePair:
    """One pair: the prompt's ids and each answer's ids (the answers end in EOS)."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]
    row: int = -1

    def sequence(self, chosen: bool) -> tuple[int, ...]:
        return self.prompt_ids + (self.chosen_ids if chosen else self.rejected_ids)


def read_pairs(path: str | Path) -> list[PreferencePair]:
    """Every pair of the store at `path`; a prompt store (GRPO's) is refused by name."""
    kind = read_meta(path).get("kind", "prompts")
    if kind != "pairwise":
        raise StoreError(
            f"{path} is a {kind} store, not a pairwise one: preprocess the preference data "
            "with handler_name: AlpacaStylePairwiseHandler"
        )
    return [
        PreferencePair(
            tuple(r["prompt_ids"]), tuple(r["chosen_ids"]), tuple(r["rejected_ids"]), r["row"]
        )
        for r in iter_prompts(path)
    ]


@dataclass(frozen=True)
class PairGrid:
    """A batch of B pairs as 2B right-padded rows (chosen rows, then rejected rows):
    `tokens[i]` is a whole sequence, `answer_mask[i, t]` is 1 where token t + 1 is an answer
    token (the position whose next-token log-prob is scored)."""

    tokens: list[list[int]]
    answer_mask: list[list[int]]
    prompt_lengths: list[int]

    @property
    def pairs(self) -> int:
        return len(self.tokens) // 2


def pair_grid(pairs: list[PreferencePair], pad_id: int) -> PairGrid:
    """The batch's rows, padded to its longest sequence."""
    sides = [p.sequence(True) for p in pairs] + [p.sequence(False) for p in pairs]
    prompts = [len(p.prompt_ids) for p in pairs] * 2
    width = max(len(s) for s in sides)
    tokens = [list(s) + [pad_id] * (width - len(s)) for s in sides]
    masks = [
        [1 if prompt - 1 <= t < len(s) - 1 else 0 for t in range(width - 1)]
        for s, prompt in zip(sides, prompts)
    ]
    return PairGrid(tokens, masks, prompts)
