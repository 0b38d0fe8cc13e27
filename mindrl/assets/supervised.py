"""The few supervised steps that make an offline asset from the tiny base model (the digit
teacher, the tool-call warm-up): one optimizer step on labelled tokens, and the folder saved
beside the base's tokenizer files."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

IGNORED = -100  # transformers' label for a token that carries no loss


def supervised_step(
    model: Any, optimizer: Any, batch: Sequence[tuple[list[int], list[int]]], pad: int
) -> None:
    """One optimizer step of next-token loss; each row is (tokens, labels), IGNORED where
    a token is not learned."""
    import torch

    width = max(len(tokens) for tokens, _ in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORED, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (tokens, targets) in enumerate(batch):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, : len(tokens)] = torch.tensor(targets)
        attention[row, : len(tokens)] = 1
    loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def save_beside_base(model: Any, out_dir: Path, base: Path) -> None:
    """The trained weights, with the tokenizer and generation config as the base has them."""
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    for item in Path(base).iterdir():
        if not (out_dir / item.name).exists():
            shutil.copy(item, out_dir / item.name)
