"""The toy preference set of `dpo_tiny_cpu`, built offline on first use: one-digit sum
questions whose preferred answer is an even number and whose other answer the odd number
next to it. A random-init model ranks the two sides at chance; the preference is one a tiny
model can learn from a few hundred pairs and carry to questions it has not seen (the
held-out set asks for three-term sums)."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

from mindrl.assets.cache import assets_root
from mindrl.assets.models import tiny_model_dir

TINY_PAIRS_VERSION = 1
TINY_PAIRS_SIZE = 256
TINY_PAIRS_VAL_SIZE = 64


def toy_pair_rows(size: int, terms: int, seed: int) -> list[dict[str, str]]:
    """Rows in MindSpeed-RL's orca_rlhf shape (system, question, chosen, rejected)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        numbers = [rng.randint(0, 9) for _ in range(terms)]
        even = 2 * rng.randint(0, 4)
        odd = even + 1
        rows.append(
            {
                "system": "",
                "question": "What is " + " + ".join(map(str, numbers)) + "?",
                "chosen": f"<answer>{even}</answer>",
                "rejected": f"<answer>{odd}</answer>",
            }
        )
    return rows


def _build_pairs(name: str, size: int, terms: int, seed: int) -> Path:
    """The rows through `cli/preprocess_data.py`'s pairwise path into a cached store."""
    from mindrl.data.config import PreprocessConfig
    from mindrl.data.preprocess import run_preprocess
    from mindrl.data.store import is_store

    target = assets_root() / f"{name}-v{TINY_PAIRS_VERSION}"
    if is_store(target):
        return target
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "pairs.jsonl"
        rows = toy_pair_rows(size, terms, seed)
        source.write_text("".join(json.dumps(r) + "\n" for r in rows))
        config = PreprocessConfig(
            output_prefix=str(target),
            tokenizer_name_or_path=str(tiny_model_dir()),
            input=str(source),
            handler_name="AlpacaStylePairwiseHandler",
            prompt_type="chat",
            map_keys={"prompt": "question", "system": "system"},
            seq_length=64,
            log_interval=10_000,
        )
        run_preprocess(config, log=lambda _msg: None)
    return target


def tiny_pairs_dir() -> Path:
    """TINY_PAIRS_SIZE training pairs (two-term questions)."""
    return _build_pairs("tiny-pairs", TINY_PAIRS_SIZE, terms=2, seed=0)


def tiny_pairs_val_dir() -> Path:
    """TINY_PAIRS_VAL_SIZE held-out pairs (three-term questions: none is a training one)."""
    return _build_pairs("tiny-pairs-val", TINY_PAIRS_VAL_SIZE, terms=3, seed=1)
