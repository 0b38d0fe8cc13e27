"""Reading a pairwise store (`cli/preprocess_data.py` with AlpacaStylePairwiseHandler) into
typed pairs, and laying a batch of them out as the `SampleBatch` a DPO step scores."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mindrl.data.batch import SampleBatch, build_sample_batch
from mindrl.data.store import StoreError, iter_prompts, read_meta


@dataclass(frozen=True)
class PreferencePair:
    """One pair: the prompt's ids and each answer's ids (the answers end in EOS)."""

    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]
    row: int = -1

    @property
    def length(self) -> int:
        """Tokens of the longer side's sequence."""
        return len(self.prompt_ids) + max(len(self.chosen_ids), len(self.rejected_ids))

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


def pair_batch(pairs: list[PreferencePair], pad_id: int) -> SampleBatch:
    """The pairs as 2B rows, each pair's chosen row followed by its rejected row, so any
    even split (data-parallel chunks, micro-batches of whole pairs) keeps pairs together; the
    response mask covers the answers' tokens only."""
    prompts = [list(p.prompt_ids) for p in pairs for _ in (0, 1)]
    answers = [list(side) for p in pairs for side in (p.chosen_ids, p.rejected_ids)]
    return build_sample_batch(prompts, answers, pad_id)
