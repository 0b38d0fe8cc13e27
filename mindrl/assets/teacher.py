"""A teacher that already does the toy task, for on-policy distillation on CPU (`opd_tiny_cpu`).

Built offline on first use, like the other tiny assets: the tiny Qwen3 model (another family
than the tiny Qwen2 student, the same tokenizer) fine-tuned with a few hundred supervised steps
on the tiny prompt store, each prompt followed by its answer's digits and end-of-sequence. The
toy verifier (`digit_share`) scores the share of digits in a response, so this teacher scores
near 1 where the random student scores near 0. Same inputs, same bytes: the seed fixes the
data order and the initial weights.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from mindrl.assets.cache import assets_root, build_atomically
from mindrl.assets.models import tiny_qwen3_dir
from mindrl.assets.prompts import tiny_prompts_dir
from mindrl.assets.supervised import IGNORED, save_beside_base, supervised_step
from mindrl.assets.tokenizer import tiny_token_ids

TEACHER_VERSION = 1
TEACHER_STEPS = 150
TEACHER_BATCH = 16
TEACHER_LR = 3e-3
TEACHER_SEED = 0


def _examples(tokenizer: object) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) pairs: each stored prompt and its label's digits + eos."""
    from mindrl.data.dataset import PromptDataset

    eos = tiny_token_ids()["eos"]
    pairs = []
    for record in PromptDataset(tiny_prompts_dir()):
        digits = "".join(ch for ch in record.label if ch.isdigit()) or "0"
        answer = tokenizer.encode(digits, add_special_tokens=False)  # type: ignore[attr-defined]
        pairs.append((list(record.prompt_ids), [*answer, eos]))
    return pairs


def train_digit_teacher(out_dir: Path) -> None:
    """Fine-tune the tiny Qwen3 on `_examples` (loss on the response tokens only) and save
    it, tokenizer included, as an HF folder in `out_dir`."""

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tiny_qwen3_dir()
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    pairs = _examples(tokenizer)
    rng = random.Random(TEACHER_SEED)
    torch.manual_seed(TEACHER_SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=TEACHER_LR, weight_decay=0.0)
    pad = tiny_token_ids()["pad"]
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small: more threads only contend
    try:
        _train(model, optimizer, pairs, rng, pad)
    finally:
        torch.set_num_threads(threads)
    save_beside_base(model, out_dir, Path(base))


def _train(
    model: Any,
    optimizer: Any,
    pairs: list[tuple[list[int], list[int]]],
    rng: random.Random,
    pad: int,
) -> None:
    """TEACHER_STEPS steps of next-token loss on the responses of random batches."""

    for _ in range(TEACHER_STEPS):
        batch = rng.sample(pairs, TEACHER_BATCH)
        rows = [(p + r, [IGNORED] * len(p) + r) for p, r in batch]  # loss on the responses
        supervised_step(model, optimizer, rows, pad)


def tiny_digit_teacher_dir() -> Path:
    """Cached teacher folder: `${asset:tiny_digit_teacher}`."""
    target = assets_root() / f"tiny-digit-teacher-v{TEACHER_VERSION}"
    return build_atomically(target, train_digit_teacher)
